// A swarm in simulation: N nodes, each running the real SwimCore (peer/swim.h) as starlingd's
// protocol thread does (a probe, indirect probes if it misses, a push-pull gossip, the next
// period) and, with [rounds] enabled, rounds as its round thread does (an inner phase paced by
// peer/round_pacing.h, a partner chosen with PartnerChoice and PairingBook, the exchange), over
// the simulated network of sim/network.h, with churn.
// Discrete events on a simulated clock; everything random comes from the config's seed, so a run
// is replayed exactly, and the hash of every handled event says so.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "sim/sim_config.h"

namespace starling::sim {

// Median, 90th percentile and largest of some durations, in seconds (0 when there are none).
struct Spread {
    size_t count = 0;
    double median = 0, p90 = 0, max = 0;
};
Spread spread_of(std::vector<double> values);

struct Figures {
    int nodes_start = 0, nodes_end = 0;  // up at the start and at the end
    double node_hours = 0;               // up nodes' time after the warm-up
    uint64_t events = 0;
    uint64_t trace_hash = 0;  // of every handled event, in order
    double wall_s = 0;        // the simulation's own run time

    // From a join's first call until every up node lists it alive; joins still unknown to some
    // at the end are counted apart.
    Spread join_known_by_all;
    size_t joins_unfinished = 0;
    // From a crash until the first node suspects it, and until no up node lists it alive or
    // suspect.
    Spread crash_first_suspected, crash_known_by_all;
    size_t crashes_unfinished = 0;
    // A member suspected while it was up (wrongly), and the same for slow and frozen members.
    uint64_t false_suspicions = 0, slow_suspicions = 0, frozen_suspicions = 0;
    uint64_t false_deaths = 0, frozen_deaths = 0;  // declared dead while up or frozen
    // The protobuf payload of every membership call and answer, and the calls, per up node.
    double payload_bytes_per_node_s = 0;
    double calls_per_node_s = 0;
    double largest_message_bytes = 0;
    // At the end: of all (up node, up member) pairs, the share in which the node lists the member
    // alive.
    double alive_view_share = 0;
    // From the partition's end until every up node lists every up member alive (-1: not by the
    // end, or no partition).
    double partition_healed_s = -1;

    // Rounds ([rounds] enabled), counted from the warm-up on. Choices of a partner made, and
    // those that found one.
    uint64_t choices = 0, paired_choices = 0;
    // The same for the private nodes alone (NetworkConfig::private_share).
    uint64_t private_choices = 0, private_paired_choices = 0;
    uint64_t pair_calls_lost = 0;  // proposals sent to a private node, which never reach it
    // A joiner's choices from its state copy to its first pairing (1: paired in its first round),
    // the joiners not paired by the end, and the most choices one of those made (a joiner of the
    // last round or two is not paired yet without being stuck).
    Spread first_pair_rounds;
    size_t joiners_unpaired = 0;
    int unpaired_joiner_choices_max = 0;
    uint64_t exchange_timeouts = 0;  // a partner's message not in by the exchange timeout
    // NodeRunner's pacing before a phase: rounds skipped to the swarm's median, state copies
    // (joins included), waits while ahead of every member, waits for a slower member.
    uint64_t skips = 0, state_copies = 0, ahead_waits = 0, slower_waits = 0;
    Spread round_seconds;        // from one choice of a node to its next
    Spread choice_seconds;       // choosing a partner, start to end (pair_timeout bounds it)
    Spread wait_seconds;         // a wait before a phase, while ahead or for a slower member
    uint64_t rounds_median = 0;  // the round up nodes are at, at the end
    // The standard deviation of phi over the nodes that reached round r, for r = 0, 1, 2, 5, 10,
    // 20, 50, 100, ... as far as half the nodes got.
    std::vector<std::pair<uint64_t, double>> phi_spread;
};

Figures simulate_swarm(const SimConfig& config);
std::string format_figures(const SimConfig& config, const Figures& figures);

}  // namespace starling::sim
