// The configuration of one simulated swarm (`starling simulate --config`, configs/sim/): how many
// nodes, for how long, the network between them, churn, and the membership protocol's settings,
// which default to starlingd's own (peer/peer_config.h).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "engine/config_keys.h"
#include "peer/membership.h"
#include "peer/swim.h"

namespace starling::sim {

struct NetworkConfig {
    // Round-trip times between two nodes, log-uniform in [min, max], fixed per pair.
    double rtt_min_ms = 10.0;
    double rtt_max_ms = 300.0;
    // Each packet of a message is lost with this probability; TCP sends it again after its
    // retransmission timeout (the larger of 200 ms and the round trip), which delays the message.
    double loss = 0.0;
    double upload_bytes_per_s = 12.5e6;  // 100 Mbit/s: a node's messages leave one after another
    // One partition: from `at` for `seconds`, this share of the nodes can reach none of the rest.
    double partition_at_s = -1.0;  // below 0: none
    double partition_s = 0.0;
    double partition_share = 0.5;
    // This share of the nodes cannot be dialed (behind NAT or a firewall, and knowing it: their
    // digests say private). A call to one is lost; its own calls and the answers to them go
    // through, and so does an exchange it opens (peer/pairing.h, opens_exchange), and two private
    // nodes exchange through an anchor's relay. The seeds are never private.
    double private_share = 0.0;
    // Whether partner choice prefers pairs that can connect direct, as starlingd's does: a study
    // switch; without it, the matching and random requests ignore who is private.
    bool direct_first = true;
};

// Poisson processes: each up node leaves, crashes or freezes at these rates, and new nodes join
// the swarm at its own rate.
struct ChurnConfig {
    double joins_per_hour = 0.0;  // swarm-wide
    double leaves_per_node_hour = 0.0;
    double crashes_per_node_hour = 0.0;
    double freezes_per_node_hour = 0.0;  // a process stopped (SIGSTOP, swapping) for a while
    double freeze_s = 3.0;
    // This share of the nodes answers late: each message they handle waits slow_delay_ms first
    // (a starved CPU, a saturated link).
    double slow_share = 0.0;
    double slow_delay_ms = 600.0;
};

struct ProtocolConfig {
    std::chrono::milliseconds gossip_interval{1000};
    std::chrono::milliseconds probe_timeout{500};
    std::chrono::milliseconds join_backoff_max{30000};
    MembershipLimits limits;
    SwimSettings swim;
    // What the digests carry beside the protocol's own fields, so a message has a real size.
    std::string fingerprint = "3f9a1c27b05e44d8";
    std::string model = "n_layer=2 n_head=4 d_model=128 d_ff=512 vocab_size=256 context=256";
    std::string method = "noloco fused";
};

// Rounds (off unless enabled): each node trains an inner phase (no training: its length is the
// input), chooses a partner with starlingd's PartnerChoice and PairingBook, exchanges a message of
// message_bytes with it, and averages a scalar stand-in for phi with the partner's, which measures
// how well pairwise gossip mixes. Defaults are starlingd's ([swarm], [peer]).
struct RoundsConfig {
    bool enabled = false;
    int inner_steps = 50;     // H
    double step_s_min = 0.2;  // each node's step time, log-uniform in [min, max]
    double step_s_max = 0.3;
    double message_bytes = 1e6;  // each round message
    double state_bytes = 8e6;    // a state copy, fetched by a joiner from the member it joined
    bool overlap = true;         // round r's exchange beside round r + 1's inner phase
    double round_seconds = 0.0;  // > 0: every phase's budget; 0: automatic (peer/round_pacing.h)
    double uneven_margin = 0.25;
    std::chrono::milliseconds pair_timeout{5000};
    std::chrono::milliseconds exchange_timeout{10000};
    uint64_t max_round_gap = 1;
    double pace_timeout_s = 60.0;  // starlingd's: the longest wait per round for the others
};

struct SimConfig {
    uint64_t seed = 1;
    int nodes = 100;         // members at the start, all knowing each other
    int seeds = 3;           // the first this many nodes are every later node's seeds
    double seconds = 600.0;  // simulated time
    double warmup_s = 30.0;  // figures count from here
    NetworkConfig network;
    ChurnConfig churn;
    ProtocolConfig protocol;
    RoundsConfig rounds;

    void validate() const;  // throws starling::Error naming the key
};

SimConfig load_sim_config(const std::string& path);
std::vector<KeyDescription> sim_config_keys(SimConfig config = {});

}  // namespace starling::sim
