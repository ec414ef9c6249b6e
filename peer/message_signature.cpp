#include "peer/message_signature.h"

#include "common/error.h"

namespace starling {
namespace {

// Keeps a message signature from ever being mistaken for a signature of anything else this key
// signs (the auth metadata of a call).
constexpr std::string_view kDomain = "starling round message v1";

}  // namespace

MessageDigest::MessageDigest(uint64_t author, uint64_t round, uint32_t part, uint64_t tokens)
    : context_(EVP_MD_CTX_new()) {
    if (!context_ || EVP_DigestInit_ex(context_, EVP_sha256(), nullptr) != 1) {
        EVP_MD_CTX_free(context_);
        throw Error("cannot start a SHA-256 digest");
    }
    EVP_DigestUpdate(context_, kDomain.data(), kDomain.size());
    for (uint64_t value : {author, round, uint64_t{part}, tokens}) add_u64(value);
}

MessageDigest::~MessageDigest() { EVP_MD_CTX_free(context_); }

void MessageDigest::add_u64(uint64_t value) {
    std::array<unsigned char, 8> bytes;
    for (size_t i = 0; i < bytes.size(); i++)
        bytes[i] = static_cast<unsigned char>(value >> (8 * i));
    EVP_DigestUpdate(context_, bytes.data(), bytes.size());
}

void MessageDigest::add(std::span<const std::byte> piece) {
    // Each piece's length first: bytes moved from one chunk to the next make another digest.
    add_u64(piece.size());
    EVP_DigestUpdate(context_, piece.data(), piece.size());
}

std::array<unsigned char, 32> MessageDigest::finish() {
    std::array<unsigned char, 32> digest;
    unsigned int size = 0;
    if (EVP_DigestFinal_ex(context_, digest.data(), &size) != 1 || size != digest.size())
        throw Error("cannot finish a SHA-256 digest");
    return digest;
}

Signature MessageDigest::sign(const NodeIdentity& author) { return author.sign(finish()); }

bool MessageDigest::verify(const PublicKey& author_key, std::span<const unsigned char> signature) {
    const auto digest = finish();
    return signature.size() == kSignatureBytes && verify_signature(author_key, digest, signature);
}

std::string signature_bytes(const Signature& signature) {
    return {reinterpret_cast<const char*>(signature.data()), signature.size()};
}

std::span<const unsigned char> signature_view(const std::string& bytes) {
    return {reinterpret_cast<const unsigned char*>(bytes.data()), bytes.size()};
}

}  // namespace starling
