// What NodeState derives for the status (daemon/service/node_state.h): the ETA from the pace of
// the last rounds and the loss trend, against hand-computed values.
#include <catch2/catch.hpp>
#include <chrono>
#include <vector>

#include "daemon/service/node_state.h"

using namespace starling;
using namespace std::chrono_literals;

namespace {

std::vector<double> losses(const v1::NodeStatus& s) {
    return {s.recent_train_losses().begin(), s.recent_train_losses().end()};
}

uint64_t count_of(const FailureCounts& counts, FailureReason reason) {
    return counts[static_cast<size_t>(reason)];
}

}  // namespace

TEST_CASE("the ETA follows the pace of the last ten rounds and keeps it across a catch-up") {
    v1::NodeStatus identity;
    identity.set_total_steps(1000);
    NodeState state(identity);
    const auto t0 = NodeState::Clock::now();
    SwarmRound round;
    round.train_loss = 2.0;
    state.record_round(round, 1, 20, 0, t0);
    CHECK_FALSE(state.recorded(t0).has_eta_seconds());  // one round end: no pace yet

    round.train_loss = 1.5;
    state.record_round(round, 2, 40, 0, t0 + 10s);  // 20 steps in 10 s
    v1::NodeStatus s = state.recorded(t0 + 10s);
    REQUIRE(s.has_eta_seconds());
    CHECK(s.eta_seconds() == Approx((1000 - 40) * 0.5));
    CHECK(losses(s) == std::vector<double>{2.0, 1.5});

    // Ten rounds at 20 steps in 20 s: the first, faster rounds fall out of the window.
    auto when = t0 + 10s;
    int64_t step = 40;
    for (uint64_t r = 3; r <= 12; r++) {
        when += 20s;
        step += 20;
        state.record_round(round, r, step, 0, when);
    }
    s = state.recorded(when);
    CHECK(s.eta_seconds() == Approx(1000.0 - 240.0));

    // Past the schedule's end: nothing left.
    state.record_round(round, 13, 1200, 0, when + 20s);
    CHECK(state.recorded(when + 20s).eta_seconds() == 0.0);

    // Copied the state from the swarm 20 s later: the pace of the last ten rounds is kept (nine of
    // 20 steps in 20 s, one of 960 steps in 20 s).
    state.set_position(100, 500, when + 40s);
    s = state.recorded(when + 40s);
    REQUIRE(s.has_eta_seconds());
    CHECK(s.eta_seconds() == Approx((1000 - 500) * 200.0 / 1140.0));

    // The next round is measured from the jump, 20 steps in 10 s, not from the round before it.
    state.record_round(round, 101, 520, 0, when + 50s);
    CHECK(state.recorded(when + 50s).eta_seconds() == Approx((1000 - 520) * 190.0 / 1140.0));
}

TEST_CASE("the loss trend keeps the last 60 rounds, oldest first") {
    NodeState state(v1::NodeStatus{});
    SwarmRound round;
    for (int r = 0; r < 70; r++) {
        round.train_loss = r;
        state.record_round(round, r + 1, (r + 1) * 10, 0);
    }
    const std::vector<double> kept = losses(state.recorded());
    REQUIRE(kept.size() == 60);
    CHECK(kept.front() == 10.0);
    CHECK(kept.back() == 69.0);
}

TEST_CASE("the status adds up the seconds of every round's inner steps") {
    NodeState state(v1::NodeStatus{});
    SwarmRound round;
    for (double seconds : {0.5, 1.25, 2.0}) {
        round.inner_seconds = seconds;
        state.record_round(round, 1, 20, 0);
    }
    CHECK(state.recorded().train_seconds() == 3.75);
}

TEST_CASE("the node's failures add the round loop's own to the peer layer's") {
    NodeState state(v1::NodeStatus{});
    SwarmRound round;
    round.refused = 2;  // two messages the outer step refused
    state.record_round(round, 1, 8, 0);
    round.refused = 1;
    state.record_round(round, 2, 16, 0);
    state.record_checkpoint_failure("disk full");
    state.record_state_copy_failure();
    state.record_state_copy_failure();

    FailureCounts peer_layer{};
    peer_layer[static_cast<size_t>(FailureReason::RefusedMessage)] = 4;  // malformed on the wire
    peer_layer[static_cast<size_t>(FailureReason::Timeout)] = 5;
    const FailureCounts totals = state.failures(peer_layer);
    CHECK(count_of(totals, FailureReason::RefusedMessage) == 7);
    CHECK(count_of(totals, FailureReason::Timeout) == 5);
    CHECK(count_of(totals, FailureReason::Checkpoint) == 1);
    CHECK(count_of(totals, FailureReason::StateSync) == 2);
    CHECK(count_of(totals, FailureReason::Auth) == 0);
    CHECK(count_of(totals, FailureReason::Connection) == 0);
}
