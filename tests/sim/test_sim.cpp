#include <catch2/catch.hpp>

#include "common/error.h"
#include "sim/swarm_sim.h"

using namespace starling;
using namespace starling::sim;

namespace {

SimConfig small_swarm(int nodes, double seconds) {
    SimConfig c;
    c.nodes = nodes;
    c.seconds = seconds;
    c.warmup_s = 10;
    return c;
}

// The longest one protocol period can take: the interval, or a direct probe's timeout, the
// indirect probes' (twice it) and the gossip's (twice it), whichever is longer.
double longest_period_s(const SimConfig& c) {
    const double timeout = std::chrono::duration<double>(c.protocol.probe_timeout).count();
    return std::max(std::chrono::duration<double>(c.protocol.gossip_interval).count(), 5 * timeout);
}

}  // namespace

TEST_CASE("sim: the same seed replays the same trace, another seed another") {
    SimConfig c = small_swarm(40, 120);
    c.network.loss = 0.02;
    c.churn.joins_per_hour = 120;
    c.churn.crashes_per_node_hour = 1;
    c.churn.freezes_per_node_hour = 2;
    const Figures a = simulate_swarm(c), b = simulate_swarm(c);
    REQUIRE(a.events > 10000);
    REQUIRE(a.trace_hash == b.trace_hash);
    REQUIRE(a.events == b.events);
    REQUIRE(a.false_suspicions == b.false_suspicions);
    REQUIRE(a.payload_bytes_per_node_s == b.payload_bytes_per_node_s);
    REQUIRE(a.join_known_by_all.median == b.join_known_by_all.median);
    c.seed = 2;
    REQUIRE(simulate_swarm(c).trace_hash != a.trace_hash);
}

TEST_CASE("sim: a quiet swarm without loss suspects nobody and every node lists every other") {
    const SimConfig c = small_swarm(30, 120);
    const Figures f = simulate_swarm(c);
    REQUIRE(f.nodes_end == 30);
    REQUIRE(f.false_suspicions == 0);
    REQUIRE(f.false_deaths == 0);
    REQUIRE(f.alive_view_share == 1.0);
    // Each node makes one probe (a ping) and one gossip a period of 1 s: 2 calls a second.
    REQUIRE(f.calls_per_node_s == Approx(2.0).epsilon(0.02));
}

TEST_CASE("sim: every crash is suspected and then known by all within SWIM's bound") {
    SimConfig c = small_swarm(24, 600);
    c.churn.crashes_per_node_hour = 2;
    const Figures f = simulate_swarm(c);
    REQUIRE(f.crash_known_by_all.count >= 3);
    REQUIRE(f.crash_first_suspected.count == f.crash_known_by_all.count);
    // Every live node probes every member once per round robin of at most N - 1 periods, so within
    // that each has suspected the crashed one itself (if no gossip told it sooner); the suspicion
    // timeout later it is dead there; the figures are taken once a second.
    const double round_robin = (c.nodes - 1) * longest_period_s(c);
    const double suspicion =
        std::chrono::duration<double>(c.protocol.limits.suspicion_timeout).count();
    REQUIRE(f.crash_first_suspected.max <= round_robin);
    REQUIRE(f.crash_known_by_all.max <= round_robin + suspicion + 1.0);
    REQUIRE(f.crashes_unfinished <= 1);  // one in the last seconds may still be going
    REQUIRE(f.false_suspicions == 0);
}

TEST_CASE("sim: joiners become known to all, through the seed's view and gossip") {
    SimConfig c = small_swarm(20, 300);
    c.churn.joins_per_hour = 200;
    c.churn.leaves_per_node_hour = 2;
    const Figures f = simulate_swarm(c);
    REQUIRE(f.join_known_by_all.count >= 5);
    REQUIRE(f.joins_unfinished <= 1);
    REQUIRE(f.false_suspicions == 0);
    // A graceful leave is told to every member at once: nobody probes a leaver into suspicion.
    REQUIRE(f.false_deaths == 0);
    REQUIRE(f.alive_view_share == 1.0);
}

TEST_CASE("sim: members that answer late are given the time they take, not suspected") {
    // A fifth of the nodes handle every message 400 ms late: with links of up to 300 ms that is
    // past the 500 ms probe timeout, which each member's measured round trips raise for them.
    SimConfig c = small_swarm(30, 300);
    c.churn.slow_share = 0.2;
    c.churn.slow_delay_ms = 400;
    const Figures f = simulate_swarm(c);
    REQUIRE(f.slow_suspicions == 0);
    REQUIRE(f.false_suspicions == 0);
    REQUIRE(f.false_deaths == 0);
    // ...and a slow member that crashes is still found: within the ceiling of its timeout.
    c.churn.crashes_per_node_hour = 2;
    c.seconds = 600;
    const Figures crashes = simulate_swarm(c);
    REQUIRE(crashes.crash_known_by_all.count >= 3);
    REQUIRE(crashes.crashes_unfinished <= 1);
}

TEST_CASE("sim: a config out of range is refused naming the key") {
    SimConfig c = small_swarm(10, 10);
    c.network.rtt_min_ms = 50;
    c.network.rtt_max_ms = 20;
    REQUIRE_THROWS_WITH(simulate_swarm(c), Catch::Contains("rtt_max_ms"));
    c = small_swarm(1, 10);
    REQUIRE_THROWS_WITH(simulate_swarm(c), Catch::Contains("[sim].nodes"));
}

TEST_CASE("sim: after a partition longer than the suspicion timeout the swarm is one again") {
    SimConfig c = small_swarm(30, 240);
    c.network.partition_at_s = 40;
    c.network.partition_s = 40;
    c.network.partition_share = 0.5;
    const Figures f = simulate_swarm(c);
    // Each side declared the other dead; the side without a seed dialled the seeds with backoff
    // (at most join_backoff_max apart) and the refutations spread from there.
    REQUIRE(f.false_deaths > 0);
    REQUIRE(f.nodes_end == 30);
    REQUIRE(f.alive_view_share == 1.0);
    REQUIRE(f.partition_healed_s >= 0);
    c.seeds = 0;  // without seeds nothing brings the two sides together again
    c.network.partition_s = 80;
    REQUIRE(simulate_swarm(c).alive_view_share < 0.75);
}

// Kept seed: with the members purged after the retention (60 s) and their tombstones ignoring
// every digest of them at the incarnation they went at, the two sides of this 130 s partition
// ignored each other for good (half of the pairs still apart 230 s after it ended). A
// tombstoned member's news now lists it dead again, which reaches it, and it refutes.
TEST_CASE("sim: seed 1, a partition that outlasts the retention still heals") {
    SimConfig c = small_swarm(30, 400);
    c.network.partition_at_s = 40;
    c.network.partition_s = 130;
    const Figures f = simulate_swarm(c);
    REQUIRE(f.alive_view_share == 1.0);
    REQUIRE(f.partition_healed_s >= 0);
    REQUIRE(f.partition_healed_s < 200);
}

// ---------------------------------------------------------------------------------------------
// Rounds

namespace {

SimConfig small_rounds(int nodes, double seconds) {
    SimConfig c = small_swarm(nodes, seconds);
    c.rounds.enabled = true;
    c.rounds.inner_steps = 20;
    c.rounds.message_bytes = 200e3;
    return c;
}

double phi_spread_at(const Figures& f, uint64_t round) {
    for (const auto& [r, spread] : f.phi_spread)
        if (r == round) return spread;
    FAIL("no spread of phi for round " << round);
    return 0;
}

}  // namespace

TEST_CASE("sim: rounds replay from the seed too") {
    SimConfig c = small_rounds(30, 240);
    c.network.loss = 0.01;
    c.churn.joins_per_hour = 60;
    c.churn.crashes_per_node_hour = 1;
    c.churn.freezes_per_node_hour = 2;
    const Figures a = simulate_swarm(c), b = simulate_swarm(c);
    REQUIRE(a.choices > 300);
    REQUIRE(a.trace_hash == b.trace_hash);
    REQUIRE(a.paired_choices == b.paired_choices);
    REQUIRE(a.phi_spread == b.phi_spread);
    c.seed = 7;
    REQUIRE(simulate_swarm(c).trace_hash != a.trace_hash);
}

TEST_CASE("sim: a quiet swarm pairs every node every round, and pairwise averaging mixes phi") {
    SimConfig c = small_rounds(30, 300);
    const Figures f = simulate_swarm(c);
    // 30 nodes with one view: every node has its deterministic partner, every round.
    REQUIRE(f.choices > 30 * 10);
    REQUIRE(f.paired_choices == f.choices);
    REQUIRE(f.exchange_timeouts == 0);
    // No stall past the bound: a choice ends within the pair timeout.
    REQUIRE(f.choice_seconds.max <= std::chrono::duration<double>(c.rounds.pair_timeout).count());
    // Averaging with a partner halves the variance in expectation (a random matching each round,
    // from deterministic_groups): after 10 rounds the spread is near 2^-5 = 0.031 of the start's;
    // allow 4 times that for the draw, and far below 1.
    const double start = phi_spread_at(f, 0), r10 = phi_spread_at(f, 10);
    REQUIRE(start == Approx(1.0).margin(0.4));  // 30 draws of a standard normal
    REQUIRE(r10 < 0.125 * start);
    REQUIRE(r10 > 0.0);
}

TEST_CASE("sim: an exchange slower than its timeout is counted, from TCP's rate under loss") {
    // Every pair 300 ms apart with 4% loss: TCP sustains 1.22 x 1448 B / (0.3 s x 0.2) = 29 kB/s,
    // so a 1 MB message takes 34 s, past the 10 s exchange timeout, on every link.
    SimConfig c = small_rounds(20, 300);
    c.network.rtt_min_ms = c.network.rtt_max_ms = 300;
    c.network.loss = 0.04;
    c.rounds.message_bytes = 1e6;
    const Figures slow = simulate_swarm(c);
    REQUIRE(slow.paired_choices > 20 * 5);
    // Each paired choice starts one exchange per side; the last ones may still be running.
    REQUIRE(slow.exchange_timeouts <= slow.paired_choices);
    REQUIRE(slow.exchange_timeouts >= slow.paired_choices - 2 * c.nodes);
    // At 1% loss the rate is 59 kB/s and 1 MB takes 17 s: still past it. At 0.1%, 186 kB/s: 5.4 s.
    c.network.loss = 0.001;
    REQUIRE(simulate_swarm(c).exchange_timeouts == 0);
}

// Kept seed: a node that came late to a round asked every member in turn, each declining for
// good (past the round), for its whole pair timeout; it arrived late at the next round too and
// went solo round after round, and the others waited for it before each phase (here: joiners up
// to 15 rounds to their first pairing, 2 never paired, rounds of 9.8 s median for phases of about
// 4.9 s). Members whose digests say they are done with the round are no longer asked (done_with):
// at most 8 rounds, 5.6 s. Once the simulated choice ran beside the next phase, as starlingd runs
// it, a joiner that landed a round behind stayed there, out of the others' wait and short of a
// catch-up (10 choices to its first pairing); now it skips to the swarm's round (catch_up), and a
// copy goes on from the round after the median, beside the members' next phase
// (round_after_copy): every joiner paired in its first choice. (Since the matching is drawn from
// each member's own key rather than the view's digest, the seed's run differs: 17 joiners, all
// paired in their first choice, one more too late to choose.)
TEST_CASE("sim: seed 3, joiners pair within a few rounds of their state copy") {
    SimConfig c = small_rounds(40, 1800);
    c.seed = 3;
    c.network.loss = 0.01;
    c.churn.joins_per_hour = 60;
    const Figures f = simulate_swarm(c);
    REQUIRE(f.first_pair_rounds.count >= 15);
    REQUIRE(f.first_pair_rounds.max <= 2);
    // None stuck: one still unpaired at the end joined in the last few rounds.
    REQUIRE(f.unpaired_joiner_choices_max <= 2);
    // H = 20 steps of 0.2-0.3 s: phases of about 4.9 s (H times the median step time).
    REQUIRE(f.round_seconds.median < 1.5 * 4.9);
}

TEST_CASE("sim: nodes nobody can dial are probed and proposed to through their anchors") {
    SimConfig c = small_rounds(30, 300);
    c.network.private_share = 0.5;
    const Figures f = simulate_swarm(c);
    REQUIRE(f.private_choices > 0);
    // Proposals to a private node go through an anchor that is up (peer/pairing.h,
    // can_propose_to): every one reached its node.
    REQUIRE(f.pair_calls_lost == 0);
    // Probed through its anchors, a private node is never suspected on a quiet network (without
    // them every probe of it failed).
    CHECK(f.false_suspicions == 0);
    // A private node's partner is public, and the exchange it opens carries both messages; the
    // matching pairs each private node with a public one, so it pairs about as often as all do.
    const double share = static_cast<double>(f.private_paired_choices) / f.private_choices;
    const double all = static_cast<double>(f.paired_choices) / f.choices;
    INFO("paired: private nodes " << share << ", all " << all);
    CHECK(share > 0.8);
    CHECK(share > all - 0.1);
    REQUIRE(f.exchange_timeouts == 0);
    // Replayable like every other run.
    REQUIRE(simulate_swarm(c).trace_hash == f.trace_hash);
}

TEST_CASE(
    "sim: where private nodes outnumber public ones, the ones left over pair through relays") {
    SimConfig c = small_rounds(40, 300);
    c.network.private_share = 0.75;
    const Figures f = simulate_swarm(c);
    REQUIRE(f.private_choices > 0);
    REQUIRE(f.pair_calls_lost == 0);
    // About three private nodes to each public one: without relays only those a public node
    // took could pair (a third to a half of their choices at 100 nodes, docs/nat.md); with them
    // nearly all do, and every relayed exchange lands on a quiet network.
    const double share = static_cast<double>(f.private_paired_choices) / f.private_choices;
    INFO("paired: private nodes " << share);
    CHECK(share > 0.8);
    REQUIRE(f.exchange_timeouts == 0);
    // The study's switch: without the preference for direct pairs, partners are drawn as if
    // nobody were private, and the run differs.
    SimConfig anyone = c;
    anyone.network.direct_first = false;
    const Figures g = simulate_swarm(anyone);
    CHECK(g.trace_hash != f.trace_hash);
    CHECK(static_cast<double>(g.private_paired_choices) / g.private_choices > 0.8);
}
