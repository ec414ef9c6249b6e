#include "common/sha256.h"

#include "common/error.h"

namespace starling {

Sha256::Sha256() : context_(EVP_MD_CTX_new()) {
    if (!context_ || EVP_DigestInit_ex(context_, EVP_sha256(), nullptr) != 1) {
        EVP_MD_CTX_free(context_);
        throw Error("cannot start a SHA-256 digest");
    }
}

Sha256::~Sha256() { EVP_MD_CTX_free(context_); }

void Sha256::add(std::span<const std::byte> bytes) {
    EVP_DigestUpdate(context_, bytes.data(), bytes.size());
}

void Sha256::add(std::span<const unsigned char> bytes) {
    EVP_DigestUpdate(context_, bytes.data(), bytes.size());
}

void Sha256::add_u64(uint64_t value) {
    std::array<unsigned char, 8> bytes;
    for (size_t i = 0; i < bytes.size(); i++)
        bytes[i] = static_cast<unsigned char>(value >> (8 * i));
    add(bytes);
}

void Sha256::add_piece(std::span<const std::byte> piece) {
    add_u64(piece.size());
    add(piece);
}

Sha256Digest Sha256::finish() {
    Sha256Digest digest;
    unsigned int size = 0;
    if (EVP_DigestFinal_ex(context_, digest.data(), &size) != 1 || size != digest.size())
        throw Error("cannot finish a SHA-256 digest");
    return digest;
}

uint64_t digest_seed(const Sha256Digest& digest) {
    uint64_t seed = 0;
    for (size_t i = 0; i < 8; i++) seed |= uint64_t{digest[i]} << (8 * i);
    return seed;
}

}  // namespace starling
