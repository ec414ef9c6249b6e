#include "peer/message_signature.h"

#include "common/error.h"

namespace starling {
namespace {

// Keeps a message signature from ever being mistaken for a signature of anything else this key
// signs (the auth metadata of a call).
constexpr std::string_view kDomain = "starling round message v1";

}  // namespace

MessageDigest::MessageDigest(uint64_t author, uint64_t round, uint32_t part, uint64_t tokens) {
    sha_.add(std::as_bytes(std::span(kDomain)));
    for (uint64_t value : {author, round, uint64_t{part}, tokens}) sha_.add_u64(value);
}

void MessageDigest::add(std::span<const std::byte> piece) { sha_.add_piece(piece); }

Signature MessageDigest::sign(const NodeIdentity& author) { return author.sign(sha_.finish()); }

bool MessageDigest::verify(const PublicKey& author_key, std::span<const unsigned char> signature) {
    const auto digest = sha_.finish();
    return signature.size() == kSignatureBytes && verify_signature(author_key, digest, signature);
}

std::string signature_bytes(const Signature& signature) {
    return {reinterpret_cast<const char*>(signature.data()), signature.size()};
}

std::span<const unsigned char> signature_view(const std::string& bytes) {
    return {reinterpret_cast<const unsigned char*>(bytes.data()), bytes.size()};
}

}  // namespace starling
