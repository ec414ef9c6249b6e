// SHA-256 over pieces added in turn, on OpenSSL (which runs on the CPU's SHA instructions: 1.7 GB/s
// on one core here against 0.6 GB/s for libsodium's BLAKE2b). Message signatures
// (peer/message_signature.h) and fused NoLoCo's update sample coordinates (codec/message.h) hash
// whole messages with it.
#pragma once

#include <openssl/evp.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>

namespace starling {

using Sha256Digest = std::array<unsigned char, 32>;

class Sha256 {
public:
    Sha256();  // throws starling::Error where OpenSSL cannot start one
    ~Sha256();
    Sha256(const Sha256&) = delete;
    Sha256& operator=(const Sha256&) = delete;

    void add(std::span<const std::byte> bytes);
    void add(std::span<const unsigned char> bytes);
    void add_u64(uint64_t value);  // little-endian
    // Its length (add_u64), then its bytes: bytes moved from one piece to the next, or a piece
    // cut in two, make another digest.
    void add_piece(std::span<const std::byte> piece);
    // The digest of everything added; nothing may be added after, and it may be called once.
    Sha256Digest finish();

private:
    EVP_MD_CTX* context_;
};

// The first 8 bytes of a digest as a little-endian number: a seed no one can choose without
// changing what was hashed.
uint64_t digest_seed(const Sha256Digest& digest);

}  // namespace starling
