#include "peer/identity.h"

#include <sodium.h>
#include <sys/stat.h>

#include <charconv>
#include <cstring>
#include <fmt/format.h>

#include "common/atomic_file.h"
#include "common/error.h"

namespace starling {

void ensure_sodium() {
    static const int result = sodium_init();
    if (result < 0) throw Error("libsodium could not be initialised");
}

uint64_t random_u64() {
    ensure_sodium();
    uint64_t value = 0;
    randombytes_buf(&value, sizeof value);
    return value;
}

uint64_t node_id_from_public_key(std::span<const unsigned char> public_key) {
    ensure_sodium();
    unsigned char hash[32];
    crypto_generichash(hash, sizeof hash, public_key.data(), public_key.size(), nullptr, 0);
    uint64_t id = 0;
    for (int i = 7; i >= 0; --i) id = (id << 8) | hash[i];
    return id;
}

std::string format_node_id(uint64_t node_id) { return fmt::format("{:016x}", node_id); }

std::optional<uint64_t> parse_node_id(std::string_view text) {
    uint64_t id = 0;
    const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), id, 16);
    if (text.size() != 16 || ec != std::errc() || end != text.data() + text.size())
        return std::nullopt;
    return id;
}

NodeIdentity NodeIdentity::generate() {
    ensure_sodium();
    NodeIdentity identity;
    crypto_sign_keypair(identity.public_key_.data(), identity.secret_key_.data());
    identity.node_id_ = node_id_from_public_key(identity.public_key_);
    return identity;
}

NodeIdentity NodeIdentity::load_or_create(const std::filesystem::path& dir) {
    ensure_sodium();
    const auto path = dir / "node.key";
    std::error_code ec;
    if (!std::filesystem::exists(path, ec)) {
        std::filesystem::create_directories(dir, ec);
        if (ec)
            throw Error(
                fmt::format("cannot create data directory {}: {}", dir.string(), ec.message()));
        NodeIdentity identity = generate();
        // The temporary file is created with the process umask; tighten it before it holds the key.
        AtomicFileWriter writer(path);
        if (chmod(writer.temp_path().c_str(), 0600) != 0)
            throw Error(
                fmt::format("cannot restrict permissions of {}", writer.temp_path().string()));
        writer.write(std::as_bytes(std::span(identity.secret_key_)));
        writer.commit();
        return identity;
    }
    const auto bytes = read_file_bytes(path);
    NodeIdentity identity;
    if (bytes.size() != identity.secret_key_.size())
        throw Error(fmt::format("node key {} is damaged: {} bytes, expected {}", path.string(),
                                bytes.size(), identity.secret_key_.size()));
    std::memcpy(identity.secret_key_.data(), bytes.data(), bytes.size());
    PublicKey derived{};
    unsigned char seed[crypto_sign_SEEDBYTES];
    crypto_sign_ed25519_sk_to_seed(seed, identity.secret_key_.data());
    std::array<unsigned char, 64> regenerated{};
    crypto_sign_seed_keypair(derived.data(), regenerated.data(), seed);
    sodium_memzero(seed, sizeof seed);
    if (regenerated != identity.secret_key_)
        throw Error(
            fmt::format("node key {} is damaged: its public half does not match its secret half",
                        path.string()));
    identity.public_key_ = derived;
    identity.node_id_ = node_id_from_public_key(identity.public_key_);
    return identity;
}

Signature NodeIdentity::sign(std::span<const unsigned char> message) const {
    Signature signature{};
    crypto_sign_detached(signature.data(), nullptr, message.data(), message.size(),
                         secret_key_.data());
    return signature;
}

bool verify_signature(std::span<const unsigned char> public_key,
                      std::span<const unsigned char> message,
                      std::span<const unsigned char> signature) {
    ensure_sodium();
    if (public_key.size() != kPublicKeyBytes || signature.size() != kSignatureBytes) return false;
    return crypto_sign_verify_detached(signature.data(), message.data(), message.size(),
                                       public_key.data()) == 0;
}

}  // namespace starling
