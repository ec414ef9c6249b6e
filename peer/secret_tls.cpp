#include "peer/secret_tls.h"

#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <memory>

#include "common/error.h"
#include "peer/auth.h"

namespace starling {
namespace {

constexpr std::string_view kCaDomain = "starling swarm tls ca v1";
// Fixed, so that every node writes the CA certificate with the same bytes; nothing here expires.
constexpr const char* kNotBefore = "20000101000000Z";
constexpr const char* kNotAfter = "99991231235959Z";

struct KeyFree {
    void operator()(EVP_PKEY* key) const { EVP_PKEY_free(key); }
};
struct CertificateFree {
    void operator()(X509* certificate) const { X509_free(certificate); }
};
struct BioFree {
    void operator()(BIO* bio) const { BIO_free(bio); }
};
using Key = std::unique_ptr<EVP_PKEY, KeyFree>;
using Certificate = std::unique_ptr<X509, CertificateFree>;
using Bio = std::unique_ptr<BIO, BioFree>;

[[noreturn]] void fail(const char* what) {
    ERR_clear_error();
    throw Error(std::string("cannot make the swarm's TLS certificates from its secret: ") + what);
}

void need(bool ok, const char* what) {
    if (!ok) fail(what);
}

Bio memory_bio() {
    Bio bio(BIO_new(BIO_s_mem()));
    need(bio != nullptr, "out of memory");
    return bio;
}

std::string text_of(BIO* bio) {
    char* data = nullptr;
    const long size = BIO_get_mem_data(bio, &data);
    return std::string(data, static_cast<size_t>(size));
}

std::string certificate_pem(X509* certificate) {
    const Bio bio = memory_bio();
    need(PEM_write_bio_X509(bio.get(), certificate) == 1, "cannot write a certificate");
    return text_of(bio.get());
}

std::string key_pem(EVP_PKEY* key) {
    const Bio bio = memory_bio();
    need(PEM_write_bio_PrivateKey(bio.get(), key, nullptr, nullptr, 0, nullptr, nullptr) == 1,
         "cannot write a key");
    return text_of(bio.get());
}

void add_extension(X509* certificate, X509* issuer, int nid, const char* value) {
    X509V3_CTX context;
    X509V3_set_ctx_nodb(&context);
    X509V3_set_ctx(&context, issuer, certificate, nullptr, nullptr, 0);
    X509_EXTENSION* extension = X509V3_EXT_conf_nid(nullptr, &context, nid, value);
    need(extension != nullptr, "cannot make a certificate extension");
    const int added = X509_add_ext(certificate, extension, -1);
    X509_EXTENSION_free(extension);
    need(added == 1, "cannot add a certificate extension");
}

Certificate unsigned_certificate(const char* common_name, uint64_t serial, EVP_PKEY* key) {
    Certificate certificate(X509_new());
    need(certificate != nullptr, "out of memory");
    X509_NAME* name = X509_get_subject_name(certificate.get());
    need(X509_set_version(certificate.get(), X509_VERSION_3) == 1 &&
             ASN1_INTEGER_set_uint64(X509_get_serialNumber(certificate.get()), serial) == 1 &&
             ASN1_TIME_set_string(X509_getm_notBefore(certificate.get()), kNotBefore) == 1 &&
             ASN1_TIME_set_string(X509_getm_notAfter(certificate.get()), kNotAfter) == 1 &&
             X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC,
                                        reinterpret_cast<const unsigned char*>(common_name), -1, -1,
                                        0) == 1 &&
             X509_set_pubkey(certificate.get(), key) == 1,
         "cannot fill in a certificate");
    return certificate;
}

}  // namespace

TlsPem tls_from_secret(std::string_view swarm_secret) {
    const auto ca_seed = swarm_derived_key(kCaDomain, swarm_secret);
    const Key ca_key(
        EVP_PKEY_new_raw_private_key(EVP_PKEY_ED25519, nullptr, ca_seed.data(), ca_seed.size()));
    need(ca_key != nullptr, "cannot make the CA key");
    Certificate ca = unsigned_certificate("starling swarm", 1, ca_key.get());
    need(X509_set_issuer_name(ca.get(), X509_get_subject_name(ca.get())) == 1,
         "cannot fill in the CA certificate");
    add_extension(ca.get(), ca.get(), NID_basic_constraints, "critical,CA:TRUE");
    add_extension(ca.get(), ca.get(), NID_key_usage, "critical,keyCertSign");
    add_extension(ca.get(), ca.get(), NID_subject_key_identifier, "hash");
    // Ed25519 signs without a separate digest, and its signatures are deterministic.
    need(X509_sign(ca.get(), ca_key.get(), nullptr) > 0, "cannot sign the CA certificate");

    const Key node_key(EVP_PKEY_Q_keygen(nullptr, nullptr, "ED25519"));
    need(node_key != nullptr, "cannot make the node's key");
    uint64_t serial = 0;
    need(RAND_bytes(reinterpret_cast<unsigned char*>(&serial), sizeof(serial)) == 1,
         "no random bytes for a serial number");
    Certificate node = unsigned_certificate("starling node", (serial >> 1) | 2, node_key.get());
    need(X509_set_issuer_name(node.get(), X509_get_subject_name(ca.get())) == 1,
         "cannot fill in the node's certificate");
    add_extension(node.get(), ca.get(), NID_basic_constraints, "critical,CA:FALSE");
    add_extension(node.get(), ca.get(), NID_key_usage, "critical,digitalSignature");
    add_extension(node.get(), ca.get(), NID_ext_key_usage, "serverAuth,clientAuth");
    add_extension(node.get(), ca.get(), NID_authority_key_identifier, "keyid:always");
    need(X509_sign(node.get(), ca_key.get(), nullptr) > 0, "cannot sign the node's certificate");

    return {certificate_pem(ca.get()), certificate_pem(node.get()), key_pem(node_key.get())};
}

}  // namespace starling
