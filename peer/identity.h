// A node's persistent identity: an Ed25519 key pair kept in its data directory. The node id is
// derived from the public key, so a node cannot claim another's id without its secret key, and
// the id survives restarts (the data stream and the swarm's memory of the node follow it).
#pragma once

#include <array>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <string_view>

namespace starling {

inline constexpr size_t kPublicKeyBytes = 32;
inline constexpr size_t kSignatureBytes = 64;

using PublicKey = std::array<unsigned char, kPublicKeyBytes>;
using Signature = std::array<unsigned char, kSignatureBytes>;

// The first 8 bytes (little-endian) of BLAKE2b-256 of the public key.
uint64_t node_id_from_public_key(std::span<const unsigned char> public_key);

// 16 lowercase hex digits, the form logs and the CLI show.
std::string format_node_id(uint64_t node_id);
// format_node_id's text back; nullopt for anything that is not 16 hex digits.
std::optional<uint64_t> parse_node_id(std::string_view text);

class NodeIdentity {
public:
    // A fresh key pair from the system's randomness.
    static NodeIdentity generate();
    // Reads <dir>/node.key, or creates it (mode 0600, written atomically) when absent. A file of
    // the wrong size, or one whose public half does not match its secret half, is an error naming
    // the file: a damaged key must not silently become a new identity.
    static NodeIdentity load_or_create(const std::filesystem::path& dir);

    uint64_t node_id() const { return node_id_; }
    const PublicKey& public_key() const { return public_key_; }
    Signature sign(std::span<const unsigned char> message) const;

private:
    NodeIdentity() = default;
    std::array<unsigned char, 64> secret_key_{};  // libsodium's form: seed then public key
    PublicKey public_key_{};
    uint64_t node_id_ = 0;
};

bool verify_signature(std::span<const unsigned char> public_key,
                      std::span<const unsigned char> message,
                      std::span<const unsigned char> signature);

// 64 bits from the system's randomness (nonces, incarnations, shuffles that must differ between
// nodes started at the same instant).
uint64_t random_u64();

// libsodium must be initialised once before any of the above; every entry point calls this.
void ensure_sodium();

}  // namespace starling
