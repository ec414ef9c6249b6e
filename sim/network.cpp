#include "sim/network.h"

#include <algorithm>
#include <cmath>

namespace starling::sim {

namespace {

constexpr size_t kSegmentBytes = 1448;  // a TCP segment's payload on a 1500-byte MTU
constexpr Time kMinRetransmitTimeout = std::chrono::milliseconds(200);  // Linux's TCP_RTO_MIN

double unit_interval(uint64_t hash) { return static_cast<double>(hash >> 11) * 0x1.0p-53; }

}  // namespace

uint64_t mix64(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

Network::Network(const NetworkConfig& config, uint64_t seed) : config_(config), seed_(seed) {}

Time Network::round_trip(uint32_t a, uint32_t b) const {
    const uint64_t low = std::min(a, b), high = std::max(a, b);
    const double u = unit_interval(mix64(seed_ ^ mix64((low << 32) | high)));
    const double ms = config_.rtt_min_ms * std::pow(config_.rtt_max_ms / config_.rtt_min_ms, u);
    return std::chrono::duration_cast<Time>(std::chrono::duration<double, std::milli>(ms));
}

bool Network::isolated(uint32_t node) const {
    return unit_interval(mix64(seed_ ^ 0x5041525449ull ^ mix64(node))) < config_.partition_share;
}

bool Network::cut(uint32_t a, uint32_t b, Time now) const {
    if (config_.partition_at_s < 0) return false;
    const double t = std::chrono::duration<double>(now).count();
    if (t < config_.partition_at_s || t >= config_.partition_at_s + config_.partition_s)
        return false;
    return isolated(a) != isolated(b);
}

Time Network::arrival(uint32_t a, uint32_t b, size_t bytes, Time now, Time& upload_free,
                      std::mt19937_64& rng) const {
    const Time rtt = round_trip(a, b);
    const auto sending = std::chrono::duration_cast<Time>(
        std::chrono::duration<double>(static_cast<double>(bytes) / config_.upload_bytes_per_s));
    upload_free = std::max(upload_free, now) + sending;
    Time at = upload_free + rtt / 2;
    if (config_.loss > 0) {
        // A membership call is a short flow: a lost segment has no later ones to trigger a fast
        // retransmit, so it waits for the retransmission timeout.
        const size_t segments = std::max<size_t>(1, (bytes + kSegmentBytes - 1) / kSegmentBytes);
        std::binomial_distribution<size_t> lost(segments, config_.loss);
        at += static_cast<int64_t>(lost(rng)) * std::max(kMinRetransmitTimeout, rtt);
    }
    return at;
}

Time Network::bulk_arrival(uint32_t a, uint32_t b, size_t bytes, Time now,
                           Time& upload_free) const {
    const Time rtt = round_trip(a, b);
    const auto at_rate = [&](double bytes_per_s) {
        return std::chrono::duration_cast<Time>(
            std::chrono::duration<double>(static_cast<double>(bytes) / bytes_per_s));
    };
    upload_free = std::max(upload_free, now) + at_rate(config_.upload_bytes_per_s);
    double rate = config_.upload_bytes_per_s;
    if (config_.loss > 0)
        rate = std::min(rate,
                        1.22 * static_cast<double>(kSegmentBytes) /
                            (std::chrono::duration<double>(rtt).count() * std::sqrt(config_.loss)));
    return std::max(upload_free, now + at_rate(rate)) + rtt / 2;
}

}  // namespace starling::sim
