#include "sim/sim_config.h"

#include "common/error.h"
#include "engine/config_reader.h"

namespace starling::sim {

namespace {

template <class V>
void visit_sim_config(V& v, SimConfig& c) {
    v.section("sim");
    v("seed", c.seed, "seeds everything random: the same seed gives the same trace");
    v("nodes", c.nodes, "members at the start, each knowing all the others", in_range(2, 100000));
    v("seeds", c.seeds, "the first this many nodes are every later node's seeds", at_least(0));
    v("seconds", c.seconds, "simulated time", above(0));
    v("warmup_s", c.warmup_s, "simulated seconds before the figures start counting", at_least(0));
    NetworkConfig& n = c.network;
    v.section("network");
    v("rtt_min_ms", n.rtt_min_ms, "the shortest round trip between two nodes", above(0));
    v("rtt_max_ms", n.rtt_max_ms, "the longest; each pair's is log-uniform in between", above(0));
    v("loss", n.loss, "probability that a packet is lost (TCP resends it after its timeout)",
      in_range_open_max(0, 1));
    v("upload_mbit", MegabitsPerSecond{n.upload_bytes_per_s}, "each node's upload rate", above(0));
    v("partition_at_s", n.partition_at_s, "when a partition starts; below 0: none");
    v("partition_s", n.partition_s, "how long it lasts", at_least(0));
    v("partition_share", n.partition_share, "the share of nodes cut off from the rest",
      in_range_open_min(0, 1));
    v("private_share", n.private_share,
      "share of nodes members cannot dial (behind NAT): calls to them are lost, their own go through",
      in_range(0, 1));
    v("direct_first", n.direct_first,
      "partner choice prefers pairs that can connect direct, as starlingd's does; false: it "
      "ignores who is private (what the preference costs in mixing)");
    ChurnConfig& ch = c.churn;
    v.section("churn");
    v("joins_per_hour", ch.joins_per_hour, "new nodes joining, swarm-wide", at_least(0));
    v("leaves_per_node_hour", ch.leaves_per_node_hour, "graceful leaves per up node", at_least(0));
    v("crashes_per_node_hour", ch.crashes_per_node_hour, "crashes per up node", at_least(0));
    v("freezes_per_node_hour", ch.freezes_per_node_hour, "freezes (a stopped process) per up node",
      at_least(0));
    v("freeze_s", ch.freeze_s, "how long a freeze lasts", above(0));
    v("slow_share", ch.slow_share, "share of nodes that answer late", in_range(0, 1));
    v("slow_delay_ms", ch.slow_delay_ms, "how late they handle each message", at_least(0));
    ProtocolConfig& p = c.protocol;
    v.section("membership");
    v("gossip_interval_ms", Milliseconds{p.gossip_interval}, "one protocol period", at_least(1));
    v("probe_timeout_ms", Milliseconds{p.probe_timeout}, "a direct probe's wait", at_least(1));
    v("join_backoff_max_ms", Milliseconds{p.join_backoff_max},
      "the longest wait before dialling a seed that is no member again", at_least(1));
    v("suspicion_timeout_ms", Milliseconds{p.limits.suspicion_timeout}, "SUSPECT to DEAD",
      at_least(1));
    v("retention_ms", Milliseconds{p.limits.retention}, "how long DEAD and LEFT are listed",
      at_least(1));
    v("max_members", p.limits.max_members, "the member table's cap", at_least(2));
    v("indirect_probes", p.swim.indirect_probes, "members asked to probe indirectly", at_least(0));
    v("full_view_max", p.swim.full_view_max, "views up to this many members gossip whole",
      at_least(1));
    v("digests_max", p.swim.digests_max, "digests in one gossip message past that", at_least(1));
    v("retransmit_factor", p.swim.retransmit_factor,
      "each change is passed on this many times log2 of the swarm's size", at_least(1));
    RoundsConfig& r = c.rounds;
    v.section("rounds");
    v("enabled", r.enabled, "simulate rounds: inner phases, pairing, exchanges, phi's mixing");
    v("inner_steps", r.inner_steps, "H: inner steps per round", in_range(1, 100000));
    v("step_s_min", r.step_s_min, "the fastest node's step time", above(0));
    v("step_s_max", r.step_s_max, "the slowest; each node's is log-uniform in between", above(0));
    v("message_bytes", r.message_bytes, "a round message's size", at_least(1));
    v("state_bytes", r.state_bytes, "a state copy's size, fetched by each joiner", at_least(1));
    v("overlap", r.overlap, "round r's exchange beside round r + 1's inner phase");
    v("round_seconds", r.round_seconds, "each phase's time budget; 0: automatic", at_least(0));
    v("uneven_margin", r.uneven_margin,
      "automatic rounds: the step-time spread that starts a budget", at_least(0));
    v("pair_timeout_ms", Milliseconds{r.pair_timeout}, "choosing a round's partner, in all",
      at_least(1));
    v("exchange_timeout_ms", Milliseconds{r.exchange_timeout}, "an exchange's wait for the message",
      at_least(1));
    v("max_round_gap", r.max_round_gap, "a partner's round differs by at most this", at_least(0));
    v("pace_timeout_s", r.pace_timeout_s, "the longest wait before a phase for the others",
      at_least(0));
}

}  // namespace

void SimConfig::validate() const {
    SimConfig keys = *this;  // the visit takes the fields by reference
    KeyRangeChecker check;
    visit_sim_config(check, keys);
    if (network.rtt_max_ms < network.rtt_min_ms)
        throw Error("config: [network].rtt_max_ms must be at least rtt_min_ms");
    if (rounds.step_s_max < rounds.step_s_min)
        throw Error("config: [rounds].step_s_max must be at least step_s_min");
    if (seeds > nodes) throw Error("config: [sim].seeds must be at most [sim].nodes");
    if (static_cast<size_t>(nodes) >= protocol.limits.max_members)
        throw Error("config: [membership].max_members must be above [sim].nodes");
}

SimConfig load_sim_config(const std::string& path) {
    return load_config_file<SimConfig>(path, [](auto& v, SimConfig& c) { visit_sim_config(v, c); });
}

std::vector<KeyDescription> sim_config_keys(SimConfig config) {
    KeyDescriber describe;
    visit_sim_config(describe, config);
    return describe.keys;
}

}  // namespace starling::sim
