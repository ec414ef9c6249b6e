#include "peer/auth.h"

#include <sodium.h>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <charconv>
#include <cstdlib>

#include "common/error.h"

namespace starling {
namespace {

constexpr std::string_view kDomain = "starling swarm key v1";

std::string to_hex(std::span<const unsigned char> bytes) {
    std::string hex(bytes.size() * 2 + 1, '\0');
    sodium_bin2hex(hex.data(), hex.size(), bytes.data(), bytes.size());
    hex.pop_back();
    return hex;
}

// Exactly `out.size()` bytes of hex, or false.
bool from_hex(std::string_view hex, std::span<unsigned char> out) {
    size_t written = 0;
    return hex.size() == out.size() * 2 &&
           sodium_hex2bin(out.data(), out.size(), hex.data(), hex.size(), nullptr, &written,
                          nullptr) == 0 &&
           written == out.size();
}

// The value of a credential header, empty when it is absent; *repeated is set when it appears
// more than once (which of two values a check would see is not something to leave to chance).
std::string_view metadata(const grpc::ServerContextBase& context, const char* key, bool* repeated) {
    const auto& all = context.client_metadata();
    const auto [first, last] = all.equal_range(key);
    if (first == last) return {};
    if (std::next(first) != last) *repeated = true;
    return {first->second.data(), first->second.size()};
}

int64_t unix_ms() {
    return std::chrono::duration_cast<std::chrono::milliseconds>(
               std::chrono::system_clock::now().time_since_epoch())
        .count();
}

std::span<const unsigned char> bytes_of(std::string_view text) {
    return {reinterpret_cast<const unsigned char*>(text.data()), text.size()};
}

}  // namespace

std::array<unsigned char, 32> swarm_derived_key(std::string_view domain,
                                                std::string_view swarm_secret) {
    ensure_sodium();
    if (swarm_secret.empty())
        throw Error("peer.swarm_secret is empty: every node of a swarm needs the same secret");
    std::array<unsigned char, 32> key{};
    crypto_generichash_state state;
    crypto_generichash_init(&state, nullptr, 0, key.size());
    crypto_generichash_update(&state, bytes_of(domain).data(), domain.size());
    crypto_generichash_update(&state, bytes_of(swarm_secret).data(), swarm_secret.size());
    crypto_generichash_final(&state, key.data(), key.size());
    return key;
}

SwarmAuth::SwarmAuth(std::string_view swarm_secret, const NodeIdentity& identity, RateLimit limit,
                     std::chrono::seconds clock_window)
    : identity_(identity), limit_(limit), clock_window_(clock_window) {
    swarm_key_ = swarm_derived_key(kDomain, swarm_secret);
}

std::string SwarmAuth::canonical(std::string_view method, std::string_view node,
                                 std::string_view key, std::string_view time) const {
    return fmt::format("starling-v1\n{}\n{}\n{}\n{}", method, node, key, time);
}

void SwarmAuth::attach(grpc::ClientContext& context, std::string_view method) const {
    const std::string node = format_node_id(identity_.node_id());
    const std::string key = to_hex(identity_.public_key());
    const std::string time = std::to_string(unix_ms());
    const std::string message = canonical(method, node, key, time);
    std::array<unsigned char, crypto_auth_hmacsha256_BYTES> mac{};
    crypto_auth_hmacsha256(mac.data(), bytes_of(message).data(), message.size(), swarm_key_.data());
    context.AddMetadata("starling-node", node);
    context.AddMetadata("starling-key", key);
    context.AddMetadata("starling-time", time);
    context.AddMetadata("starling-mac", to_hex(mac));
    context.AddMetadata("starling-sig", to_hex(identity_.sign(bytes_of(message))));
}

grpc::Status SwarmAuth::verify(const grpc::ServerContextBase& context, std::string_view method,
                               uint64_t* caller) {
    const auto refuse = [this](const std::string& why) {
        refusals_++;
        return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "starling peer auth: " + why);
    };
    bool repeated = false;
    const std::string_view node = metadata(context, "starling-node", &repeated);
    const std::string_view key_hex = metadata(context, "starling-key", &repeated);
    const std::string_view time = metadata(context, "starling-time", &repeated);
    const std::string_view mac_hex = metadata(context, "starling-mac", &repeated);
    const std::string_view sig_hex = metadata(context, "starling-sig", &repeated);
    if (repeated) return refuse("credentials given more than once");
    if (node.empty() || key_hex.empty() || time.empty() || mac_hex.empty() || sig_hex.empty())
        return refuse("missing credentials (starling-node, -key, -time, -mac, -sig metadata)");
    PublicKey key{};
    std::array<unsigned char, crypto_auth_hmacsha256_BYTES> mac{};
    Signature sig{};
    if (!from_hex(key_hex, key) || !from_hex(mac_hex, mac) || !from_hex(sig_hex, sig))
        return refuse("malformed credentials");
    int64_t sent_ms = 0;
    const auto [end, ec] = std::from_chars(time.data(), time.data() + time.size(), sent_ms);
    if (ec != std::errc() || end != time.data() + time.size())
        return refuse("malformed starling-time");
    const int64_t window_ms =
        std::chrono::duration_cast<std::chrono::milliseconds>(clock_window_).count();
    if (std::abs(unix_ms() - sent_ms) > window_ms)
        return refuse(
            fmt::format("clock skew beyond {} s (check NTP on both nodes)", clock_window_.count()));
    const uint64_t id = node_id_from_public_key(key);
    if (format_node_id(id) != node) return refuse("node id does not match the public key");
    const std::string message = canonical(method, node, key_hex, time);
    if (crypto_auth_hmacsha256_verify(mac.data(), bytes_of(message).data(), message.size(),
                                      swarm_key_.data()) != 0) {
        warn_wrong_secret(context, node);
        return refuse("wrong swarm secret");
    }
    if (!verify_signature(key, bytes_of(message), sig)) return refuse("bad signature");
    if (on_proven_) on_proven_(context);
    if (!admit(id))
        return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                            fmt::format("node {} exceeds {} requests/s", node, limit_.per_second));
    *caller = id;
    return grpc::Status::OK;
}

void SwarmAuth::warn_wrong_secret(const grpc::ServerContextBase& context, std::string_view node) {
    const uint64_t refused = ++wrong_secret_refusals_;
    {
        MutexLock lock(mutex_);
        if (!wrong_secret_warning_.due()) return;
    }
    // The node id is the caller's claim, unproven: cut to an id's length before it is logged.
    spdlog::warn(
        "peer: refused a caller at {} naming itself node {}: wrong swarm secret ({} call(s) refused so "
        "far); every node of a swarm needs the same [peer].secret",
        context.peer(), node.substr(0, 16), refused);
}

bool SwarmAuth::admit(uint64_t caller) {
    const auto now = std::chrono::steady_clock::now();
    MutexLock lock(mutex_);
    auto it = buckets_.find(caller);
    if (it == buckets_.end()) {
        if (buckets_.size() >= limit_.max_callers) {
            const auto stalest = std::min_element(
                buckets_.begin(), buckets_.end(), [](const auto& a, const auto& b) {
                    return a.second.refilled() < b.second.refilled();
                });
            buckets_.erase(stalest);
        }
        it = buckets_.emplace(caller, TokenBucket(limit_.per_second, limit_.burst, now)).first;
    }
    return it->second.take(1.0, now);
}

}  // namespace starling
