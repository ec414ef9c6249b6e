#include "peer/tls.h"

#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509_vfy.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <grpcpp/security/tls_certificate_verifier.h>
#include <grpcpp/security/tls_credentials_options.h>

#include <vector>

#include "common/atomic_file.h"
#include "common/error.h"
#include "peer/secret_tls.h"

namespace starling {
namespace {

template <auto Free>
struct Freer {
    template <typename T>
    void operator()(T* p) const {
        Free(p);
    }
};
using Bio = std::unique_ptr<BIO, Freer<BIO_free>>;
using Certificate = std::unique_ptr<X509, Freer<X509_free>>;
using Key = std::unique_ptr<EVP_PKEY, Freer<EVP_PKEY_free>>;
using Store = std::unique_ptr<X509_STORE, Freer<X509_STORE_free>>;
using StoreContext = std::unique_ptr<X509_STORE_CTX, Freer<X509_STORE_CTX_free>>;
void free_stack(STACK_OF(X509) * stack) { sk_X509_free(stack); }  // a macro in OpenSSL 3
using CertificateStack = std::unique_ptr<STACK_OF(X509), Freer<free_stack>>;  // holds, does not own

Bio memory_bio(const std::string& text) {
    return Bio(BIO_new_mem_buf(text.data(), static_cast<int>(text.size())));
}

std::vector<Certificate> read_certificates(const std::string& pem, const std::string& setting) {
    Bio bio = memory_bio(pem);
    std::vector<Certificate> certificates;
    while (X509* certificate = PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr))
        certificates.emplace_back(certificate);
    ERR_clear_error();  // the read past the last one fails by design
    if (certificates.empty()) throw Error(setting + " holds no PEM certificate");
    return certificates;
}

TlsPem read_tls_files(const TlsConfig& tls) {
    const auto read = [](const std::filesystem::path& path, const char* setting) {
        if (path.empty())
            throw Error(
                std::string("TLS needs all of peer.tls_ca, peer.tls_cert and peer.tls_key; ") +
                setting + " is not set");
        try {
            return read_file(path);
        } catch (const Error& e) {
            throw Error(std::string(setting) + ": " + e.what());
        }
    };
    return {read(tls.ca, "peer.tls_ca"), read(tls.cert, "peer.tls_cert"),
            read(tls.key, "peer.tls_key")};
}

}  // namespace

namespace {

std::shared_ptr<grpc::ChannelCredentials> tls_channel_credentials(
    std::shared_ptr<grpc::experimental::CertificateProviderInterface> provider,
    bool check_host_name) {
    grpc::experimental::TlsChannelCredentialsOptions options;
    options.set_certificate_provider(std::move(provider));
    options.watch_root_certs();
    options.watch_identity_key_cert_pairs();
    // The chain is verified against the CA either way; the verifier adds the host name check.
    options.set_verify_server_certs(true);
    if (check_host_name) {
        options.set_certificate_verifier(
            std::make_shared<grpc::experimental::HostNameCertificateVerifier>());
    } else {
        options.set_certificate_verifier(
            std::make_shared<grpc::experimental::NoOpCertificateVerifier>());
        options.set_check_call_host(false);
    }
    return grpc::experimental::TlsCredentials(options);
}

std::shared_ptr<grpc::experimental::CertificateProviderInterface> static_provider(
    const TlsPem& pem) {
    return std::make_shared<grpc::experimental::StaticDataCertificateProvider>(
        pem.ca, std::vector<grpc::experimental::IdentityKeyCertPair>{{pem.key, pem.cert}});
}

}  // namespace

std::shared_ptr<grpc::ChannelCredentials> channel_credentials(const TlsConfig& tls,
                                                              std::string_view swarm_secret) {
    if (!tls.enabled())
        return tls_channel_credentials(static_provider(tls_from_secret(swarm_secret)), false);
    const TlsPem files = read_tls_files(tls);
    grpc::SslCredentialsOptions options;
    options.pem_root_certs = files.ca;
    options.pem_private_key = files.key;
    options.pem_cert_chain = files.cert;
    return grpc::SslCredentials(options);
}

bool refused_in_tls_handshake(const grpc::Status& status) {
    if (status.error_code() != grpc::StatusCode::UNAVAILABLE) return false;
    const std::string& text = status.error_message();
    // OpenSSL's words: this side's verification failed, or the far end's alert says it refused.
    for (const char* sign :
         {"certificate verify failed", "alert unknown ca", "alert bad certificate",
          "alert certificate required", "alert decrypt error"})
        if (text.find(sign) != std::string::npos) return true;
    return false;
}

std::string trust_anchor(const TlsConfig& tls) {
    return tls.enabled() ? read_tls_files(tls).ca : std::string();
}

namespace {

void check_tls_pem(const TlsConfig& tls, const TlsPem& files) {
    const std::string ca = "peer.tls_ca (" + tls.ca.string() + ")";
    const std::string cert = "peer.tls_cert (" + tls.cert.string() + ")";
    const std::string key_setting = "peer.tls_key (" + tls.key.string() + ")";
    const std::vector<Certificate> roots = read_certificates(files.ca, ca);
    const std::vector<Certificate> chain = read_certificates(files.cert, cert);
    Bio key_bio = memory_bio(files.key);
    const Key key(PEM_read_bio_PrivateKey(key_bio.get(), nullptr, nullptr, nullptr));
    ERR_clear_error();
    if (!key) throw Error(key_setting + " holds no unencrypted PEM private key");
    if (X509_check_private_key(chain.front().get(), key.get()) != 1) {
        ERR_clear_error();
        throw Error(key_setting + " is not the key of the certificate in " + cert);
    }
    const Store store(X509_STORE_new());
    for (const Certificate& root : roots) X509_STORE_add_cert(store.get(), root.get());
    const CertificateStack intermediates(sk_X509_new_null());
    for (size_t i = 1; i < chain.size(); ++i) sk_X509_push(intermediates.get(), chain[i].get());
    const StoreContext context(X509_STORE_CTX_new());
    if (!store || !intermediates || !context ||
        X509_STORE_CTX_init(context.get(), store.get(), chain.front().get(), intermediates.get()) !=
            1)
        throw Error("cannot check " + cert + ": out of memory");
    if (X509_verify_cert(context.get()) != 1) {
        const int error = X509_STORE_CTX_get_error(context.get());
        ERR_clear_error();
        throw Error(cert + " does not verify against " + ca + ": " +
                    X509_verify_cert_error_string(error));
    }
}

}  // namespace

void check_tls_files(const TlsConfig& tls) { check_tls_pem(tls, read_tls_files(tls)); }

TlsCertificates::TlsCertificates(const TlsConfig& tls, std::filesystem::path stage_dir)
    : stage_dir_(std::move(stage_dir)), temporary_(stage_dir_.empty()) {
    if (temporary_) {
        std::string name =
            (std::filesystem::temp_directory_path() / "starling-tls-XXXXXX").string();
        if (::mkdtemp(name.data()) == nullptr)
            throw Error("cannot make a temporary directory for the TLS files in use");
        stage_dir_ = name;
    }
    std::error_code ec;
    std::filesystem::create_directories(stage_dir_, ec);
    if (ec || ::chmod(stage_dir_.c_str(), 0700) != 0)
        throw Error("cannot make " + stage_dir_.string() + " for the TLS files in use: " +
                    (ec ? ec.message() : std::string("cannot restrict its permissions")));
    try {
        stage(tls);
    } catch (...) {
        if (temporary_) std::filesystem::remove_all(stage_dir_, ec);
        throw;
    }
    provider_ = std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
        (stage_dir_ / "key.pem").string(), (stage_dir_ / "cert.pem").string(),
        (stage_dir_ / "ca.pem").string(), kRefreshSeconds);
}

TlsCertificates::TlsCertificates(std::string_view swarm_secret)
    : provider_(static_provider(tls_from_secret(swarm_secret))) {}

TlsCertificates::~TlsCertificates() {
    // Credentials made from the provider share it and can outlive this object (a channel still
    // open): gRPC then keeps the certificates it read last, logging that the removed temporary
    // files cannot be read again. A node with a data directory keeps its files.
    std::error_code ec;
    if (temporary_) std::filesystem::remove_all(stage_dir_, ec);
}

void TlsCertificates::reload(const TlsConfig& tls) {
    if (from_secret())
        throw Error("the certificates made from the swarm secret cannot be replaced by files");
    stage(tls);
}

void TlsCertificates::stage(const TlsConfig& tls) {
    const TlsPem files = read_tls_files(tls);
    check_tls_pem(tls, files);
    MutexLock lock(stage_mutex_);
    // The key before its certificate: the watcher may read between the two, and gRPC then keeps
    // the pair it had until its next look a second later.
    write_file_atomic(stage_dir_ / "key.pem", files.key);
    write_file_atomic(stage_dir_ / "cert.pem", files.cert);
    write_file_atomic(stage_dir_ / "ca.pem", files.ca);
}

std::shared_ptr<grpc::ServerCredentials> TlsCertificates::server_credentials() const {
    grpc::experimental::TlsServerCredentialsOptions options(provider_);
    options.watch_root_certs();
    options.watch_identity_key_cert_pairs();
    options.set_cert_request_type(GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
    return grpc::experimental::TlsServerCredentials(options);
}

std::shared_ptr<grpc::ChannelCredentials> TlsCertificates::channel_credentials() const {
    return tls_channel_credentials(provider_, !from_secret());
}

}  // namespace starling
