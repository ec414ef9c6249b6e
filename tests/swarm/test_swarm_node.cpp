// Swarm nodes on real gRPC servers on 127.0.0.1 (local_cluster_config: Pair calls 1 s, exchanges
// 3 s), training pico on the KJV, each node on its own thread as separate daemons would.
#include <atomic>
#include <barrier>
#include <catch2/catch.hpp>
#include <chrono>
#include <cmath>
#include <cstring>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <thread>

#include "daemon/config.h"
#include "daemon/swarm/swarm_node.h"
#include "daemon/swarm/swarm_snapshot.h"
#include "kernels/cpu/cpu_ops.h"
#include "optimizer/outer_round.h"
#include "peer/local_cluster.h"
#include "tests/peer/cluster_util.h"
#include "tests/swarm/swarm_util.h"

using namespace starling;
using namespace starling::test;
using namespace std::chrono_literals;

namespace {

// n nodes; the first is every other node's seed. Returns once all see all alive with one view.
std::vector<std::unique_ptr<SwarmNode>> start_swarm(int n, const SwarmConfig& config) {
    std::vector<std::unique_ptr<SwarmNode>> nodes;
    for (int i = 0; i < n; i++) {
        SwarmConfig c = config;
        if (i > 0) c.peer.seeds = {nodes.front()->peer().address()};
        nodes.push_back(std::make_unique<SwarmNode>(c));
    }
    std::vector<PeerNode*> peers;
    for (auto& node : nodes) peers.push_back(&node->peer());
    wait_for("one view", 20000ms,
             [&] { return all_see_all_alive(peers) && same_pairable_view(peers); });
    return nodes;
}

// DiLoCo with D sent as F32 and no error feedback: every node decodes exactly what was sent.
SwarmConfig exact_diloco_swarm() {
    SwarmConfig config = pico_swarm(2);
    config.method = OuterMethod::DiLoCo;
    config.exchange.delta_codec = codec::Codec::F32;
    config.exchange.error_feedback = false;
    return config;
}

// `rounds` rounds on every node at once: reports[node][round].
std::vector<std::vector<SwarmRound>> run_rounds(std::vector<std::unique_ptr<SwarmNode>>& nodes,
                                                int rounds) {
    std::vector<std::vector<SwarmRound>> reports(nodes.size());
    on_threads(nodes.size(), [&](size_t i) {
        for (int r = 0; r < rounds; r++) reports[i].push_back(nodes[i]->run_round());
    });
    return reports;
}

// Bytes of one uncompressed message, from the plan: the 64-byte header, then for every segment
// (each fits one chunk in pico) a 48-byte chunk header and the payload of its codec.
uint64_t message_bytes(const codec::MessagePlan& plan) {
    uint64_t total = 64;
    for (const codec::Segment& s : plan.segments) {
        REQUIRE(s.numel <= codec::max_chunk_elements(s.codec));
        REQUIRE((s.codec == codec::Codec::F32 || s.codec == codec::Codec::BF16SR));
        total += 48 + s.numel * (s.codec == codec::Codec::F32 ? 4 : 2);
    }
    return total;
}

// A fused NoLoCo round's messages: theta under the node's plan, and beside it the update sample
// where one is configured (theta and phi at update_sample coordinates, F32).
uint64_t fused_round_bytes(const SwarmNode& node, const SwarmConfig& config) {
    const uint64_t theta = message_bytes(node.message_plan());
    if (config.exchange.update_sample == 0) return theta;
    return theta + message_bytes(codec::sample_plan(ParameterManifest(config.train.model),
                                                    2 * uint64_t{config.exchange.update_sample}));
}

// What a node's replica does alone, rebuilt from the same config and node id: the reference the
// swarm's outer steps are checked against.
struct ReferenceReplica {
    ReferenceReplica(const SwarmConfig& config, uint64_t node_id)
        : backend(make_backend({"cpu", config.train.threads, "fp32"})),
          schedule(config.train.lr_schedule()) {
        replica = std::make_unique<Replica>(config.train, 1, backend, 0, node_id);
    }
    Backend backend;
    LrSchedule schedule;
    std::unique_ptr<Replica> replica;
};

std::vector<float> copy_of(std::span<const float> x) { return {x.begin(), x.end()}; }

// A reference replica per node, built from the same config and node id.
std::vector<std::unique_ptr<ReferenceReplica>> references_of(
    const std::vector<std::unique_ptr<SwarmNode>>& nodes, const SwarmConfig& config) {
    set_cpu_threads(config.train.threads);
    std::vector<std::unique_ptr<ReferenceReplica>> refs;
    for (const auto& node : nodes)
        refs.push_back(std::make_unique<ReferenceReplica>(config, node->node_id()));
    return refs;
}

// NoLoCo's fused step on a reference replica, with both nodes' thetas as sent and each side
// weighed by its weight (the tokens it trained; equal weights: the plain mean).
void reference_noloco_step(const SwarmConfig& config, ReferenceReplica& ref,
                           const ReferenceReplica& partner, std::span<const float> own_sent,
                           std::span<const float> partner_sent, double own_weight = 1.0,
                           double partner_weight = 1.0) {
    const size_t n = ref.replica->size();
    std::vector<float> scratch_a(n), scratch_b(n);
    PartnerChecks checks;
    MemberValues own{ref.replica->node_id(), own_sent, {}};
    MemberValues theirs{partner.replica->node_id(), partner_sent, {}};
    own.weight = own_weight;
    theirs.weight = partner_weight;
    REQUIRE(noloco_outer_step(config.outer, MessageMode::Fused, own, {&theirs, 1}, checks,
                              ref.replica->phi(), ref.replica->momentum(), scratch_a, scratch_b)
                .members == 2);
}

// Each reference replica's inner phase, alone: theta, phi and the outer momentum at its end.
struct PhaseEnds {
    std::vector<std::vector<float>> thetas, phis, momenta;
};
PhaseEnds inner_phases_alone(std::vector<std::unique_ptr<ReferenceReplica>>& refs, int steps) {
    PhaseEnds ends;
    for (auto& ref : refs) {
        ref->replica->inner_phase(steps, ref->schedule);
        ends.thetas.push_back(copy_of(ref->replica->theta()));
        ends.phis.push_back(copy_of(ref->replica->phi()));
        ends.momenta.push_back(copy_of(ref->replica->momentum()));
    }
    return ends;
}

// One round on both nodes of a pair, which must have paired with each other.
std::vector<std::vector<SwarmRound>> run_paired_round(
    std::vector<std::unique_ptr<SwarmNode>>& nodes) {
    const auto reports = run_rounds(nodes, 1);
    for (size_t i = 0; i < 2; i++) {
        INFO(reports[i][0].failure);
        REQUIRE(reports[i][0].partner == nodes[1 - i]->node_id());
        REQUIRE_FALSE(reports[i][0].solo);
    }
    return reports;
}

}  // namespace

TEST_CASE("swarm: four nodes pair mutually, exchange BF16 theta of the planned size, and learn") {
    const int rounds = 5;
    const SwarmConfig config = pico_swarm(rounds);
    auto nodes = start_swarm(4, config);
    std::map<uint64_t, size_t> index_of;
    for (size_t i = 0; i < nodes.size(); i++) index_of[nodes[i]->node_id()] = i;
    const uint64_t expected_bytes = fused_round_bytes(*nodes[0], config);
    // The plan really mixes codecs: norm gains as F32, matrices as BF16.
    CHECK(nodes[0]->message_plan().segments.size() > 1);

    const auto reports = run_rounds(nodes, rounds);

    int paired = 0;
    double first = 0.0, last = 0.0;
    for (size_t i = 0; i < nodes.size(); i++) {
        REQUIRE(reports[i].size() == rounds);
        first += reports[i].front().train_loss / nodes.size();
        last += reports[i].back().train_loss / nodes.size();
        for (int r = 0; r < rounds; r++) {
            const SwarmRound& rep = reports[i][r];
            INFO("node " << i << " round " << r << ": " << rep.failure);
            CHECK(rep.round == static_cast<uint64_t>(r));
            if (!rep.partner) {
                CHECK(rep.solo);
                CHECK(rep.bytes_sent == 0);
                continue;
            }
            const size_t j = index_of.at(*rep.partner);
            CHECK(reports[j][r].partner == nodes[i]->node_id());
            CHECK(rep.failure.empty());
            CHECK_FALSE(rep.solo);
            CHECK(rep.bytes_sent == expected_bytes);
            CHECK(rep.bytes_received == expected_bytes);
            paired++;
        }
        CHECK(nodes[i]->round() == static_cast<uint64_t>(rounds));
    }
    INFO("mean train loss " << first << " -> " << last << ", " << paired << " paired node-rounds");
    // Four nodes with one view pair deterministically; a round may still go solo when a node runs
    // a round ahead, but not most of them.
    CHECK(paired >= static_cast<int>(nodes.size()) * rounds / 2);
    CHECK(last < first - 0.5);
}

TEST_CASE(
    "swarm: a paired outer step equals NoLoCo computed from both nodes' thetas (F32 messages)") {
    const SwarmConfig config = pico_swarm(2, codec::Codec::F32);
    auto nodes = start_swarm(2, config);
    auto refs = references_of(nodes, config);

    for (int round = 0; round < 2; round++) {
        INFO("round " << round);
        run_paired_round(nodes);
        // The same inner phases, alone: theta of each node.
        const auto [thetas, phis, momenta] = inner_phases_alone(refs, config.inner_steps);
        for (size_t i = 0; i < 2; i++) {
            Replica& node = nodes[i]->replica();
            // Bit for bit, by the optimizer's NoLoCo step on copies, as the experiment steps.
            Replica& ref = *refs[i]->replica;
            const size_t n = ref.size();
            reference_noloco_step(config, *refs[i], *refs[1 - i], thetas[i], thetas[1 - i]);
            ref.restart_from_phi();
            CHECK(same_bits(node.phi(), ref.phi()));
            CHECK(same_bits(node.momentum(), ref.momentum()));
            CHECK(same_bits(node.theta(), ref.phi()));

            // And in double from NoLoCo's equations (fused, gamma = beta):
            // delta = alpha delta + beta (mean(theta_a, theta_b) - phi); phi += delta.
            double worst = 0.0;
            for (size_t k = 0; k < n; k++) {
                const double mean = (double(thetas[0][k]) + double(thetas[1][k])) / 2.0;
                const double delta = config.outer.momentum * double(momenta[i][k]) +
                                     config.outer.lr * (mean - double(phis[i][k]));
                worst =
                    std::max(worst, std::abs(double(ref.phi()[k]) - (double(phis[i][k]) + delta)));
            }
            CHECK(worst < 1e-6);  // float rounding of values of order 0.1-1
        }
    }
}

TEST_CASE("swarm_method names the mode and the update sample, which members must share") {
    // Two fused members with samples of other counts send messages the other cannot read: the
    // method they say keeps them from pairing, as it does a split member and a fused one.
    SwarmConfig config = pico_swarm(1);
    CHECK(swarm_method(config) == "noloco fused, update sample 8192");  // the default
    config.exchange.update_sample = 4096;
    CHECK(swarm_method(config) == "noloco fused, update sample 4096");
    config.exchange.update_sample = 0;
    CHECK(swarm_method(config) == "noloco fused");
    config.exchange.update_sample = 8192;
    config.exchange.mode = MessageMode::Split;
    CHECK(swarm_method(config) == "noloco split");
    config.method = OuterMethod::DiLoCo;
    CHECK(swarm_method(config) == "diloco");
}

TEST_CASE(
    "swarm: split messages (D and phi at once) give NoLoCo's split step, with a pull unlike the lr") {
    SwarmConfig config = pico_swarm(2, codec::Codec::F32);
    config.exchange.mode = MessageMode::Split;
    config.exchange.delta_codec = codec::Codec::F32;
    config.exchange.error_feedback = false;
    config.outer.pull = 0.3f;  // fused messages could not carry this: it needs the partner's phi
    auto nodes = start_swarm(2, config);
    auto refs = references_of(nodes, config);
    const uint64_t both_messages = 2 * message_bytes(nodes[0]->message_plan());

    for (int round = 0; round < 2; round++) {
        INFO("round " << round);
        const auto reports = run_paired_round(nodes);
        for (size_t i = 0; i < 2; i++) {
            CHECK(reports[i][0].bytes_sent == both_messages);
            CHECK(reports[i][0].bytes_received == both_messages);
        }
        std::vector<std::vector<float>> displacements, phis, momenta;
        for (auto& ref : refs) {
            ref->replica->inner_phase(config.inner_steps, ref->schedule);
            ref->replica->compute_displacement();
            displacements.push_back(copy_of(ref->replica->displacement()));
            phis.push_back(copy_of(ref->replica->phi()));
            momenta.push_back(copy_of(ref->replica->momentum()));
        }
        for (size_t i = 0; i < 2; i++) {
            Replica& ref = *refs[i]->replica;
            const size_t n = ref.size();
            std::vector<float> scratch_a(n), scratch_b(n);
            PartnerChecks checks;
            const MemberValues own{ref.node_id(), displacements[i], ref.phi()};
            const MemberValues partner{refs[1 - i]->replica->node_id(), displacements[1 - i],
                                       phis[1 - i]};
            REQUIRE(noloco_outer_step(config.outer, MessageMode::Split, own, {&partner, 1}, checks,
                                      ref.phi(), ref.momentum(), scratch_a, scratch_b)
                        .members == 2);
            ref.restart_from_phi();
            CHECK(same_bits(nodes[i]->replica().phi(), ref.phi()));
            CHECK(same_bits(nodes[i]->replica().momentum(), ref.momentum()));

            // NoLoCo's split step in double: delta = alpha delta + beta mean(D) + gamma (mean(phi)
            // - phi).
            double worst = 0.0;
            for (size_t k = 0; k < n; k++) {
                const double mean_d =
                    (double(displacements[0][k]) + double(displacements[1][k])) / 2.0;
                const double mean_phi = (double(phis[0][k]) + double(phis[1][k])) / 2.0;
                const double delta = config.outer.momentum * double(momenta[i][k]) +
                                     config.outer.lr * mean_d +
                                     config.outer.pull * (mean_phi - double(phis[i][k]));
                worst =
                    std::max(worst, std::abs(double(ref.phi()[k]) - (double(phis[i][k]) + delta)));
            }
            CHECK(worst < 1e-6);
        }
    }
}

TEST_CASE(
    "swarm: DiLoCo's all-gather: three nodes take the same step, the optimizer's on all three D") {
    const SwarmConfig config = exact_diloco_swarm();
    auto nodes = start_swarm(3, config);
    auto refs = references_of(nodes, config);
    std::sort(refs.begin(), refs.end(), [](const auto& a, const auto& b) {
        return a->replica->node_id() < b->replica->node_id();
    });
    const uint64_t message = message_bytes(nodes[0]->message_plan());

    for (int round = 0; round < 2; round++) {
        INFO("round " << round);
        const auto reports = run_rounds(nodes, 1);
        for (const auto& r : reports) {
            INFO(r[0].failure);
            REQUIRE(r[0].quorum == 3);
            CHECK(r[0].bytes_received == 2 * message);
        }
        std::vector<std::vector<float>> displacements;
        for (auto& ref : refs) {
            ref->replica->inner_phase(config.inner_steps, ref->schedule);
            ref->replica->compute_displacement();
            displacements.push_back(copy_of(ref->replica->displacement()));
        }
        const std::vector<std::span<const float>> decoded(displacements.begin(),
                                                          displacements.end());
        for (auto& ref : refs) {
            std::vector<float> scratch(ref->replica->size());
            diloco_outer_step(config.outer, decoded, ref->replica->phi(), ref->replica->momentum(),
                              scratch);
            ref->replica->restart_from_phi();
        }
        for (auto& node : nodes) {
            CHECK(same_bits(node->replica().phi(), refs[0]->replica->phi()));
            CHECK(same_bits(node->replica().momentum(), refs[0]->replica->momentum()));
        }
    }
}

TEST_CASE("swarm: overlapped DiLoCo nodes gather all three D and land on the same phi") {
    SwarmConfig config = pico_swarm(3);
    config.method = OuterMethod::DiLoCo;
    config.overlap = true;
    auto nodes = start_swarm(3, config);
    const auto reports = run_rounds(nodes, 3);
    std::vector<std::optional<SwarmRound>> last(3);
    on_threads(3, [&](size_t i) { last[i] = nodes[i]->land_exchange(); });
    for (size_t i = 0; i < 3; i++) {
        CHECK_FALSE(reports[i][0].landed);
        for (const SwarmRound& r : {reports[i][1], reports[i][2], *last[i]}) {
            INFO("node " << i << " round " << r.round << ": " << r.failure);
            CHECK(r.landed);
            CHECK(r.quorum == 3);
        }
        CHECK(nodes[i]->round() == 3);
        CHECK(same_bits(nodes[i]->replica().phi(), nodes[0]->replica().phi()));
        CHECK(same_bits(nodes[i]->replica().momentum(), nodes[0]->replica().momentum()));
    }
}

TEST_CASE("swarm: DiLoCo leaves out a member that died and goes on with the rest") {
    SwarmConfig config = pico_swarm(4);
    config.method = OuterMethod::DiLoCo;
    auto nodes = start_swarm(3, config);
    run_rounds(nodes, 1);
    nodes.back()->kill();
    nodes.pop_back();
    const auto start = std::chrono::steady_clock::now();
    const auto reports = run_rounds(nodes, 2);
    const double bound =
        std::chrono::duration<double>(config.peer.exchange_timeout).count() * 2 + 2.0;
    CHECK(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() < bound);
    for (const auto& r : reports) CHECK(r.back().quorum == 2);
    CHECK(same_bits(nodes[0]->replica().phi(), nodes[1]->replica().phi()));
}

TEST_CASE(
    "swarm: a killed node: survivors keep rounding within the deadlines and never pair with it") {
    const SwarmConfig config = pico_swarm(40);
    auto nodes = start_swarm(4, config);
    const size_t victim = 3;
    const uint64_t victim_id = nodes[victim]->node_id();
    // The longest a round may wait on the network: choosing the partner (pair_timeout in all) and
    // one exchange (exchange_timeout),
    // plus 1 s for a cancelled stream to end and for four threads sharing two cores.
    const double network_bound =
        std::chrono::duration<double>(config.peer.pair_timeout + config.peer.exchange_timeout +
                                      1000ms)
            .count();

    // Rounds start together, as on nodes of equal speed: otherwise a node that goes solo finishes
    // sooner, runs more than max_round_gap rounds ahead and can pair with no one, which is not
    // what this test is about. The survivors stop three rounds after all of them have declared
    // the victim dead, once two of them have paired since: on a busy box a round's pairing can
    // time out and leave every survivor solo, so the test waits for a pairing rather than
    // expecting one in each of a fixed number of rounds.
    std::atomic<bool> stop{false};
    std::atomic<int> paired_since_death{0};
    int rounds_after_death = 0;
    const auto give_up = std::chrono::steady_clock::now() + 60s;
    auto next_round = [&]() noexcept {
        bool all_dead = true;
        for (size_t i = 0; i < victim; i++)
            all_dead &= state_seen(nodes[i]->peer(), victim_id) == MemberState::Dead;
        if (all_dead) rounds_after_death++;
        if ((rounds_after_death > 3 && paired_since_death >= 2) ||
            std::chrono::steady_clock::now() > give_up)
            stop = true;
    };
    std::barrier round_start(static_cast<std::ptrdiff_t>(nodes.size()), next_round);

    struct Seen {
        SwarmRound report;
        double wall_seconds = 0.0;
        bool victim_dead_before = false;
    };
    std::vector<std::vector<Seen>> seen(nodes.size());
    on_threads(nodes.size(), [&](size_t i) {
        SwarmNode& node = *nodes[i];
        if (i == victim) {
            for (int r = 0; r < 3; r++) {
                round_start.arrive_and_wait();
                // Killed in the middle of its third round's inner phase, as a crash would.
                std::thread crash;
                if (r == 2)
                    crash = std::thread([&] {
                        std::this_thread::sleep_for(20ms);
                        node.kill();
                    });
                node.run_round();
                if (crash.joinable()) crash.join();
            }
            round_start.arrive_and_drop();
            return;
        }
        while (true) {
            round_start.arrive_and_wait();
            if (stop) return;
            Seen s;
            s.victim_dead_before = state_seen(node.peer(), victim_id) == MemberState::Dead;
            const auto start = std::chrono::steady_clock::now();
            s.report = node.run_round();
            s.wall_seconds =
                std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
            if (s.victim_dead_before && !s.report.solo) paired_since_death++;
            seen[i].push_back(s);
        }
    });

    REQUIRE(rounds_after_death > 3);  // every survivor declared the victim dead before giving up
    int paired_after_death = 0;
    for (size_t i = 0; i < victim; i++) {
        INFO("survivor " << i);
        for (const Seen& s : seen[i]) {
            INFO("round " << s.report.round << ": " << s.report.failure);
            CHECK(s.report.pair_seconds + s.report.exchange_seconds < network_bound);
            CHECK(s.wall_seconds < s.report.inner_seconds + network_bound);
            if (s.victim_dead_before) {
                CHECK(s.report.partner != victim_id);
                if (!s.report.solo) paired_after_death++;
            }
        }
    }
    // The survivors pair with each other again: both members of a pair count it.
    CHECK(paired_after_death >= 2);
}

TEST_CASE(
    "swarm: a node joining from the swarm holds a donor's snapshot: phi, momentum, AdamW, counters") {
    const SwarmConfig config = pico_swarm(4);
    auto nodes = start_swarm(3, config);
    run_rounds(nodes, 2);

    SwarmConfig joiner_config = config;
    joiner_config.peer.seeds = {nodes.front()->peer().address()};
    nodes.push_back(std::make_unique<SwarmNode>(joiner_config));
    SwarmNode& joiner = *nodes.back();
    std::vector<PeerNode*> peers;
    for (auto& node : nodes) peers.push_back(&node->peer());
    wait_for("the joiner in one view", 20000ms,
             [&] { return all_see_all_alive(peers) && same_pairable_view(peers); });

    const FetchResult fetched = joiner.join_from_swarm();
    std::shared_ptr<const Snapshot> donated;
    SwarmNode* donor = nullptr;
    for (auto& node : nodes) {
        if (node.get() == &joiner) continue;
        if (auto s = node->peer().snapshots().find(fetched.manifest.id)) {
            donated = s;
            donor = node.get();
        }
    }
    REQUIRE(donated);
    // The donors stopped after round 2, so what they hold is their current state.
    const std::vector<std::byte> donor_state = donor->snapshot_bytes();
    REQUIRE(donated->bytes().size() == donor_state.size());
    CHECK(std::memcmp(donated->bytes().data(), donor_state.data(), donor_state.size()) == 0);

    const std::vector<std::byte> joined = joiner.snapshot_bytes();
    REQUIRE(joined.size() == swarm_snapshot_bytes(donor->replica().size()));
    CHECK(std::memcmp(joined.data(), donor_state.data(), joined.size()) == 0);
    // And field by field, from the donor's own replica.
    Replica& mine = joiner.replica();
    Replica& theirs = donor->replica();
    const size_t n = mine.size();
    CHECK(joiner.round() == 2);
    CHECK(donor->round() == 2);
    CHECK(mine.inner_step() == 2 * kInnerSteps);
    CHECK(mine.inner_step() == theirs.inner_step());
    CHECK(mine.adamw_steps() == theirs.adamw_steps());
    CHECK(same_bits(mine.phi(), theirs.phi()));
    CHECK(same_bits(mine.momentum(), theirs.momentum()));
    CHECK(same_bits(mine.adamw_m_host(), theirs.adamw_m_host()));
    CHECK(same_bits(mine.adamw_v_host(), theirs.adamw_v_host()));
    CHECK(same_bits(mine.theta(), mine.phi()));
    CHECK(std::all_of(mine.residual().begin(), mine.residual().end(),
                      [](float x) { return x == 0.0f; }));
    CHECK(joiner.node_id() != donor->node_id());

    // A snapshot for another model size is refused, naming the problem.
    std::vector<float> small(n - 1);
    CHECK_THROWS_WITH(unpack_swarm_snapshot(joined, {small, small, small, small}),
                      Catch::Contains("this model needs"));

    // The joiner takes part in the next round like any member.
    for (const auto& r : run_rounds(nodes, 1)) {
        INFO(r[0].failure);
        CHECK(r[0].round == 2);
        CHECK(r[0].failure.empty());
    }
}

TEST_CASE(
    "swarm: skipping to the swarm's round keeps the state, moves the schedule on and publishes it") {
    SwarmNode node(pico_swarm(6));
    node.run_round();
    REQUIRE(node.round() == 1);
    const std::vector<float> phi(node.replica().phi().begin(), node.replica().phi().end());
    const uint64_t adamw_steps = static_cast<uint64_t>(node.replica().adamw_steps());

    node.skip_to_round(4);
    CHECK(node.round() == 4);
    CHECK(node.inner_step() == 4 * kInnerSteps);
    CHECK(same_bits(node.replica().phi(), phi));
    CHECK(same_bits(node.replica().theta(), phi));
    // What a joiner or a checkpoint now gets: the same state, under round 4's counters.
    const auto published = node.peer().snapshots().latest();
    CHECK(published == node.round_start().snapshot);
    std::vector<float> got_phi(phi.size()), momentum(phi.size()), m(phi.size()), v(phi.size());
    const SwarmCounters counters =
        unpack_swarm_snapshot(published->bytes(), {got_phi, momentum, m, v});
    CHECK(counters.round == 4);
    CHECK(counters.inner_step == 4 * kInnerSteps);
    CHECK(counters.adamw_steps == adamw_steps);
    CHECK(same_bits(got_phi, phi));

    node.skip_to_round(3);  // behind: nothing changes
    CHECK(node.round() == 4);
    CHECK(node.peer().snapshots().latest() == published);
    node.skip_to_round(40);  // past the schedule: its end, no further
    CHECK(node.round() == 40);
    CHECK(node.inner_step() == 6 * kInnerSteps);
    CHECK(node.schedule_done());

    // Overlapped, between two rounds: the exchange in flight lands first, then the round moves.
    SwarmConfig overlapped = pico_swarm(6);
    overlapped.overlap = true;
    SwarmNode ahead(overlapped);
    ahead.run_round();
    REQUIRE(ahead.exchange_in_flight());
    ahead.skip_to_round(3);
    CHECK_FALSE(ahead.exchange_in_flight());
    CHECK(ahead.round() == 3);
    CHECK(ahead.inner_step() == 3 * kInnerSteps);
    CHECK(same_bits(ahead.replica().theta(), ahead.replica().phi()));
    CHECK(ahead.round_start().snapshot->round() == 3);
}

TEST_CASE(
    "swarm: a published snapshot a joiner still holds is never refilled, and each round's matches the state") {
    SwarmNode node(pico_swarm(20));
    // A joiner in the middle of a fetch holds the round's snapshot.
    const std::shared_ptr<const Snapshot> held = node.peer().snapshots().latest();
    const std::vector<std::byte> held_bytes(held->bytes().begin(), held->bytes().end());
    for (int r = 0; r < 6; r++) {
        node.run_round();
        const std::vector<std::byte> expected = node.snapshot_bytes();
        const std::span<const std::byte> published = node.peer().snapshots().latest()->bytes();
        REQUIRE(std::equal(published.begin(), published.end(), expected.begin(), expected.end()));
    }
    CHECK(held->round() == 0);
    CHECK(std::equal(held->bytes().begin(), held->bytes().end(), held_bytes.begin(),
                     held_bytes.end()));
}

TEST_CASE(
    "swarm: overlapped rounds train from the solo step, land the outer step of the thetas sent and "
    "rebase the steps since, as a replica computes alone") {
    SwarmConfig config = pico_swarm(3, codec::Codec::F32);
    config.overlap = true;
    auto nodes = start_swarm(2, config);
    auto refs = references_of(nodes, config);
    const uint64_t message = fused_round_bytes(*nodes[0], config);
    const int h = config.inner_steps;

    // Round 0's inner phase; its exchange starts and stays in flight.
    const auto first = run_rounds(nodes, 1);
    for (size_t i = 0; i < 2; i++) {
        CHECK_FALSE(first[i][0].landed);
        CHECK(nodes[i]->exchange_in_flight());
        CHECK(nodes[i]->round() == 0);
    }
    // Round 1's inner phase, during which round 0 lands tau steps in (tau = H: waited for).
    const auto second = run_rounds(nodes, 1);
    std::vector<int> tau(2);
    for (size_t i = 0; i < 2; i++) {
        const SwarmRound& r = second[i][0];
        INFO("node " << i << ": " << r.failure);
        REQUIRE(r.landed);
        CHECK(r.round == 0);
        REQUIRE(r.partner == nodes[1 - i]->node_id());
        REQUIRE_FALSE(r.solo);
        CHECK(r.bytes_sent == message);  // the sequential round's message, unchanged
        CHECK(r.bytes_received == message);
        tau[i] = r.overlap_steps;
        CHECK((tau[i] >= 0 && tau[i] <= h));
        CHECK(nodes[i]->round() == 1);
        CHECK(nodes[i]->exchange_in_flight());  // round 1's
    }
    // Round 1's exchange, landed before any step of round 2.
    std::vector<std::optional<SwarmRound>> last(2);
    on_threads(2, [&](size_t i) { last[i] = nodes[i]->land_exchange(); });

    // The reference: round 0 alone; each replica's solo step from its own theta (fused NoLoCo
    // alone: delta = alpha delta + beta (theta - phi), on copies), and the step on both thetas.
    std::vector<std::vector<float>> sent0, sent1, start(2);
    std::vector<LoaderState> round1_start;
    for (auto& ref : refs) {
        ref->replica->inner_phase(h, ref->schedule);
        sent0.push_back(copy_of(ref->replica->theta()));
        round1_start.push_back(ref->replica->data().state());
    }
    for (size_t i = 0; i < 2; i++) {
        Replica& ref = *refs[i]->replica;
        start[i].resize(ref.size());
        for (size_t k = 0; k < ref.size(); k++) {
            const float delta = config.outer.momentum * ref.momentum()[k] +
                                config.outer.lr * (sent0[i][k] - ref.phi()[k]);
            start[i][k] = ref.phi()[k] + delta;
        }
    }
    for (size_t i = 0; i < 2; i++)
        reference_noloco_step(config, *refs[i], *refs[1 - i], sent0[i], sent0[1 - i]);
    // ...tau steps of round 1 from the solo step's phi, moved onto phi_1, and the rest.
    for (size_t i = 0; i < 2; i++) {
        Replica& ref = *refs[i]->replica;
        ref.restart_from(start[i]);
        if (tau[i] > 0) ref.inner_phase(tau[i], refs[i]->schedule);
        ref.rebase_onto_phi(start[i]);
        if (tau[i] < h) ref.inner_phase(h - tau[i], refs[i]->schedule);
        sent1.push_back(copy_of(ref.theta()));
    }
    for (size_t i = 0; i < 2; i++)
        reference_noloco_step(config, *refs[i], *refs[1 - i], sent1[i], sent1[1 - i]);

    for (size_t i = 0; i < 2; i++) {
        INFO("node " << i << ", round 0 landed " << tau[i] << " steps on");
        REQUIRE(last[i]);
        INFO(last[i]->failure);
        CHECK(last[i]->round == 1);
        REQUIRE(last[i]->partner == nodes[1 - i]->node_id());
        CHECK(last[i]->overlap_steps == 0);
        CHECK_FALSE(nodes[i]->exchange_in_flight());
        CHECK(nodes[i]->round() == 2);
        Replica& ref = *refs[i]->replica;
        CHECK(same_bits(nodes[i]->replica().phi(), ref.phi()));
        CHECK(same_bits(nodes[i]->replica().momentum(), ref.momentum()));
        // Nothing trained since round 1's exchange started: theta is phi_2 bit for bit.
        CHECK(same_bits(nodes[i]->replica().theta(), ref.phi()));
        // The round start a checkpoint holds: round 2 with the position at its start.
        const RoundStart& saved = nodes[i]->round_start();
        CHECK(saved.snapshot->round() == 2);
        CHECK(saved.data == nodes[i]->replica().data().state());
        CHECK_FALSE(saved.data == round1_start[i]);
    }
    CHECK_FALSE(nodes[0]->land_exchange());  // none in flight
}

TEST_CASE(
    "swarm: a drain in an overlapped round lands the exchange in flight, and the round start saved "
    "is the next round's") {
    SwarmConfig config = pico_swarm(4);
    config.overlap = true;
    SwarmNode node(config);  // alone: every round goes solo
    node.run_round();
    REQUIRE(node.exchange_in_flight());
    const LoaderState round1_start = node.replica().data().state();
    const uint64_t steps_at_round1 = static_cast<uint64_t>(node.inner_step());
    // Stopped after three steps of round 1; round 0 lands during them or at the drain.
    std::atomic<bool> stop{false};
    int steps = 0;
    node.set_phase_listener([&](RoundPhase phase) {
        if (phase == RoundPhase::Training && ++steps == 3) stop = true;
    });
    int landed_rounds = 0;
    node.set_round_listener([&](const SwarmRound& r) {
        landed_rounds++;
        CHECK(r.round == 0);
        CHECK(r.solo);
    });
    CHECK(node.run_round(stop).abandoned);
    node.land_exchange();
    CHECK_FALSE(node.exchange_in_flight());
    CHECK(landed_rounds == 1);
    CHECK(node.round() == 1);
    CHECK(static_cast<uint64_t>(node.inner_step()) == steps_at_round1 + 3);
    // What a checkpoint saves: round 1 from its start, though the replica has trained on.
    const RoundStart& start = node.round_start();
    CHECK(start.snapshot->round() == 1);
    CHECK(start.data == round1_start);
    std::vector<float> phi(node.replica().size()), momentum(phi.size()), m(phi.size()),
        v(phi.size());
    const SwarmCounters counters =
        unpack_swarm_snapshot(start.snapshot->bytes(), {phi, momentum, m, v});
    CHECK(counters.round == 1);
    CHECK(counters.inner_step == steps_at_round1);
    CHECK(same_bits(phi, node.replica().phi()));
}

TEST_CASE(
    "swarm: partners that trained unequal tokens count as them in NoLoCo's step (batches 8 and 4)") {
    SwarmConfig config = pico_swarm(2, codec::Codec::F32);
    SwarmConfig small = config;
    small.train.batch_size = 4;
    std::vector<std::unique_ptr<SwarmNode>> nodes;
    nodes.push_back(std::make_unique<SwarmNode>(config));
    small.peer.seeds = {nodes[0]->peer().address()};
    nodes.push_back(std::make_unique<SwarmNode>(small));
    std::vector<PeerNode*> peers{&nodes[0]->peer(), &nodes[1]->peer()};
    wait_for("one view", 20000ms,
             [&] { return all_see_all_alive(peers) && same_pairable_view(peers); });
    const auto reports = run_paired_round(nodes);
    const uint64_t tokens[2] = {8u * 32 * kInnerSteps, 4u * 32 * kInnerSteps};
    for (size_t i = 0; i < 2; i++) {
        CHECK(reports[i][0].tokens == tokens[i]);
        CHECK(reports[i][0].partner_tokens == tokens[1 - i]);
    }
    // The same phases alone, and the step with each side weighed by its tokens.
    set_cpu_threads(config.train.threads);
    std::vector<std::unique_ptr<ReferenceReplica>> refs;
    refs.push_back(std::make_unique<ReferenceReplica>(config, nodes[0]->node_id()));
    refs.push_back(std::make_unique<ReferenceReplica>(small, nodes[1]->node_id()));
    const auto [thetas, phis, momenta] = inner_phases_alone(refs, config.inner_steps);
    for (size_t i = 0; i < 2; i++) {
        Replica& ref = *refs[i]->replica;
        const size_t n = ref.size();
        reference_noloco_step(config, *refs[i], *refs[1 - i], thetas[i], thetas[1 - i],
                              static_cast<double>(tokens[i]), static_cast<double>(tokens[1 - i]));
        CHECK(same_bits(nodes[i]->replica().phi(), ref.phi()));
        // In double: delta = alpha delta + beta (2/3 theta_0 + 1/3 theta_1 - phi).
        double worst = 0.0;
        for (size_t k = 0; k < n; k++) {
            const double mean = (2.0 * double(thetas[0][k]) + double(thetas[1][k])) / 3.0;
            const double delta = config.outer.momentum * double(momenta[i][k]) +
                                 config.outer.lr * (mean - double(phis[i][k]));
            worst = std::max(worst, std::abs(double(ref.phi()[k]) - (double(phis[i][k]) + delta)));
        }
        CHECK(worst < 1e-6);
    }
}

TEST_CASE(
    "swarm: a time budget sets each phase's steps from the node's step time and spreads H "
    "schedule steps over them") {
    SwarmConfig config = pico_swarm(4);
    config.method = OuterMethod::Local;  // phi = theta after each phase: the phases alone
    config.round_seconds = 1e-3;         // shorter than a step: one step a round from the second
    SwarmNode node(config);
    ReferenceReplica ref(config, node.node_id());
    std::vector<int> steps;
    while (!node.schedule_done()) {
        const SwarmRound r = node.run_round();
        steps.push_back(r.steps);
        CHECK(node.inner_step() == static_cast<int64_t>(node.round()) * config.inner_steps);
        CHECK(r.tokens == static_cast<uint64_t>(r.steps) * 8u * 32u);
        // The reference phase: r.steps steps with the learning rate of H schedule steps.
        ref.replica->inner_phase(r.steps, ref.schedule, config.inner_steps);
        CHECK(same_bits(node.replica().phi(), ref.replica->theta()));
    }
    CHECK(steps == std::vector<int>{kInnerSteps, 1, 1, 1});  // H before a step time is known

    SwarmConfig slow = config;
    slow.round_seconds = 1e6;  // far longer than 16 H steps take
    SwarmNode capped(slow);
    capped.run_round();
    CHECK(capped.run_round().steps == 16 * kInnerSteps);
}

TEST_CASE(
    "swarm: automatic rounds give the faster of two uneven nodes more steps than H and the slower "
    "fewer, from the step times they gossip") {
    SwarmConfig fast = pico_swarm(40);
    fast.train.batch_size = 1;
    fast.uneven_margin = 0.25;
    SwarmConfig slow = fast;
    slow.train.batch_size = 32;  // about ten times the fast node's step time
    std::vector<std::unique_ptr<SwarmNode>> nodes;
    nodes.push_back(std::make_unique<SwarmNode>(fast));
    slow.peer.seeds = {nodes[0]->peer().address()};
    nodes.push_back(std::make_unique<SwarmNode>(slow));
    std::vector<PeerNode*> peers{&nodes[0]->peer(), &nodes[1]->peer()};
    wait_for("one view", 20000ms,
             [&] { return all_see_all_alive(peers) && same_pairable_view(peers); });
    // Rounds until both have said a step time and each has planned a phase from them (gossip
    // takes a few intervals); every round takes H schedule steps whatever its step count.
    bool uneven = false;
    for (int round = 0; round < 30 && !uneven; round++) {
        const auto reports = run_rounds(nodes, 1);
        for (size_t i = 0; i < 2; i++) {
            CHECK(nodes[i]->inner_step() ==
                  static_cast<int64_t>(nodes[i]->round()) * fast.inner_steps);
            CHECK(reports[i][0].tokens ==
                  static_cast<uint64_t>(reports[i][0].steps) * (i == 0 ? 1u : 32u) * 32u);
        }
        uneven = reports[0][0].steps > kInnerSteps && reports[1][0].steps < kInnerSteps;
    }
    CHECK(uneven);
}

TEST_CASE(
    "swarm: DiLoCo weighs each member's D by the tokens it said it trained (batches 8, 8, 4)") {
    const SwarmConfig config = exact_diloco_swarm();
    std::vector<SwarmConfig> configs(3, config);
    configs[2].train.batch_size = 4;
    std::vector<std::unique_ptr<SwarmNode>> nodes;
    for (SwarmConfig& c : configs) {
        if (!nodes.empty()) c.peer.seeds = {nodes[0]->peer().address()};
        nodes.push_back(std::make_unique<SwarmNode>(c));
    }
    std::vector<PeerNode*> peers;
    for (auto& node : nodes) peers.push_back(&node->peer());
    wait_for("one view", 20000ms,
             [&] { return all_see_all_alive(peers) && same_pairable_view(peers); });
    const auto reports = run_rounds(nodes, 1);
    for (const auto& r : reports) {
        INFO(r[0].failure);
        REQUIRE(r[0].quorum == 3);
    }
    // The reference: each node's D alone, in node-id order, weighed by its tokens.
    set_cpu_threads(config.train.threads);
    std::vector<size_t> order{0, 1, 2};
    std::sort(order.begin(), order.end(),
              [&](size_t a, size_t b) { return nodes[a]->node_id() < nodes[b]->node_id(); });
    std::vector<std::vector<float>> displacements;
    std::vector<double> weights;
    std::unique_ptr<ReferenceReplica> first;
    for (size_t i : order) {
        auto ref = std::make_unique<ReferenceReplica>(configs[i], nodes[i]->node_id());
        ref->replica->inner_phase(config.inner_steps, ref->schedule);
        ref->replica->compute_displacement();
        displacements.push_back(copy_of(ref->replica->displacement()));
        weights.push_back(static_cast<double>(reports[i][0].tokens));
        if (!first) first = std::move(ref);
    }
    CHECK(weights[0] + weights[1] + weights[2] == 20.0 * 32 * kInnerSteps);
    const std::vector<std::span<const float>> decoded(displacements.begin(), displacements.end());
    std::vector<float> scratch(first->replica->size());
    diloco_outer_step(config.outer, decoded, first->replica->phi(), first->replica->momentum(),
                      scratch, weights);
    for (auto& node : nodes) {
        CHECK(same_bits(node->replica().phi(), first->replica->phi()));
        CHECK(same_bits(node->replica().momentum(), first->replica->momentum()));
    }
    // Not the plain mean: the small-batch member counts half.
    std::vector<float> plain_phi = copy_of(nodes[0]->replica().phi());
    ReferenceReplica unweighted(configs[order[0]], nodes[order[0]]->node_id());
    diloco_outer_step(config.outer, decoded, unweighted.replica->phi(),
                      unweighted.replica->momentum(), scratch);
    CHECK_FALSE(same_bits(plain_phi, copy_of(unweighted.replica->phi())));
}

TEST_CASE("swarm: a node that splits its messages is never paired with one that fuses them") {
    SwarmConfig fused = pico_swarm(2);
    SwarmConfig split = fused;
    split.exchange.mode = MessageMode::Split;
    std::vector<std::unique_ptr<SwarmNode>> nodes;
    nodes.push_back(std::make_unique<SwarmNode>(fused));
    split.peer.seeds = {nodes[0]->peer().address()};
    nodes.push_back(std::make_unique<SwarmNode>(split));
    std::vector<PeerNode*> peers{&nodes[0]->peer(), &nodes[1]->peer()};
    wait_for("both alive", 20000ms, [&] { return all_see_all_alive(peers); });
    for (auto& node : nodes)
        CHECK(node->peer().pairable_ids() == std::vector<uint64_t>{node->node_id()});
    const auto reports = run_rounds(nodes, 1);
    for (size_t i = 0; i < nodes.size(); i++) {
        INFO("node " << i << ": " << reports[i][0].failure);
        CHECK_FALSE(reports[i][0].partner.has_value());
        CHECK(reports[i][0].solo);
        CHECK(reports[i][0].failure.empty());
    }
}
