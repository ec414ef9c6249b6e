// The simulated network between nodes: a round trip fixed per pair (log-uniform between the
// configured bounds, from a hash of the seed and the pair, so no table of N^2 entries), each
// node's upload sending one message after another, TCP's retransmission delay for lost packets,
// and a partition that cuts a share of the nodes off for a while.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <random>

#include "sim/sim_config.h"

namespace starling::sim {

using Time = std::chrono::nanoseconds;  // since the simulation's start

class Network {
public:
    Network(const NetworkConfig& config, uint64_t seed);

    Time round_trip(uint32_t a, uint32_t b) const;
    // Whether a message from a to b is cut off at `now`.
    bool cut(uint32_t a, uint32_t b, Time now) const;
    // When a message of `bytes` that a sends at `now` reaches b; `upload_free` is when a's link
    // is next free, moved on by the message.
    Time arrival(uint32_t a, uint32_t b, size_t bytes, Time now, Time& upload_free,
                 std::mt19937_64& rng) const;
    // The same for a bulk transfer (an exchange, a state copy): one long TCP flow, whose losses
    // fast retransmit repairs, at the rate TCP sustains under loss (Mathis et al. 1997:
    // 1.22 segment / (RTT sqrt(loss))), at most the upload's. The upload is busy only for the
    // bytes at its own rate: other messages interleave with a flow held back by its losses.
    Time bulk_arrival(uint32_t a, uint32_t b, size_t bytes, Time now, Time& upload_free) const;

private:
    bool isolated(uint32_t node) const;  // on the partition's small side

    NetworkConfig config_;
    uint64_t seed_;
};

uint64_t mix64(uint64_t x);  // splitmix64's finalizer: a well-spread hash of x

}  // namespace starling::sim
