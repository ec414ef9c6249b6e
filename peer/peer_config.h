// What a node's peer layer is configured with: addresses, the swarm's identity and
// credentials, the membership protocol's timings and limits, and the round's deadlines.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "peer/address.h"
#include "peer/auth.h"
#include "peer/connection_gate.h"
#include "peer/membership.h"
#include "peer/swim.h"
#include "peer/tls.h"

namespace starling {

struct PeerConfig {
    std::string listen = "127.0.0.1:0";  // port 0: any free port (tests)
    std::string announce;                // what peers dial; empty: the listen host and bound port
    std::vector<std::string> seeds;      // host:port of members to join through
    // The addresses a seed names (peer/address.h), each tried until one is a member that is not
    // this node; replaceable so that a test can give a name several addresses without a DNS server.
    std::function<std::vector<std::string>(const std::string&)> resolve_seed = resolve_seed_targets;
    std::string swarm_id = "starling";
    std::string swarm_secret;  // the same on every node of a swarm; may be empty with TLS
    TlsConfig tls;             // mutual TLS on the peer port when set (peer/tls.h)
    std::string fingerprint;   // the model's; members with another are never paired
    std::string model;         // its signature (model_signature), named when they differ
    // How rounds combine ("noloco fused", "diloco", ...); members with another are never paired.
    std::string method;
    std::filesystem::path data_dir;  // node.key and peers.txt; empty: fresh identity, no cache
    std::chrono::milliseconds gossip_interval{1000};
    std::chrono::milliseconds probe_timeout{500};
    SwimSettings swim;  // indirect probes and what one gossip message holds
    MembershipLimits membership;
    std::chrono::milliseconds join_backoff_max{30000};
    size_t max_message_bytes =
        4u << 20;  // any one membership RPC; exchange frames have their own cap
    std::chrono::milliseconds pair_timeout{5000};  // T_pair: choosing a round's partner, in all
    // T_xchg: a whole exchange, end to end, at least; a partner whose measured rate (or, before an
    // exchange with it, min_link_bytes_per_s) needs longer for the message gets up to the ceiling.
    std::chrono::milliseconds exchange_timeout{10000};
    std::chrono::milliseconds exchange_timeout_max{600000};
    double min_link_bytes_per_s = 1.25e6;  // 10 Mbit/s
    // A state copy's chunk calls (FetchOptions): the least and the most time one gets, and the
    // rate assumed before a donor's first chunk, which makes it the slowest link supported.
    std::chrono::milliseconds state_sync_timeout{10000};
    std::chrono::milliseconds state_sync_timeout_max{120000};
    double state_sync_min_link_bytes_per_s = 125000;  // 1 Mbit/s
    uint64_t max_round_gap = 1;  // S_max: a partner's round differs by at most this
    int max_server_threads = 32;
    int max_concurrent_snapshot_chunks = 4;  // state sync chunks this node serves at once
    // Connections that have not yet carried an authenticated call (peer/connection_gate.h).
    ConnectionLimits connections;
    // An anchor holds at most this many MiB of its private members' round messages at once
    // (peer/round_deposits.h), each member an even share of which its last two rounds must fit:
    // 8 members (an anchor's most) with the 124M model's Q8 D's of 125 MB.
    uint64_t relay_limit_mib = 2048;
    // What an anchor passes between two private members that exchange through it
    // (peer/exchange_relay.h), all such exchanges together; 0: it relays none.
    double relay_bytes_per_s = 12.5e6;  // 100 Mbit/s
    // Two private members that pair try to connect directly first (peer/hole_punch.h), for at
    // most this long from their agreement, and go through the relay otherwise.
    bool hole_punch = true;
    std::chrono::milliseconds punch_timeout{3000};
    size_t snapshots_kept =
        2;  // so a joiner's fetch survives the next publish (and see SnapshotStore)
    RateLimit rate_limit;
};

// What proves membership of the config's swarm (SwarmAuth): the swarm secret, or, when none is
// set and TLS is on, the CA certificate the nodes trust, which then stands in for it.
std::string swarm_key_material(const PeerConfig& config);

}  // namespace starling
