// Pacing (peer/round_pacing.h): the automatic round rule and the steps that fit a budget, against
// figures worked out by hand.
#include <catch2/catch.hpp>

#include <limits>
#include <numeric>
#include <set>

#include "peer/round_pacing.h"

using namespace starling;

namespace {

std::vector<PairingFacts> at_rounds(std::vector<uint64_t> rounds) {
    std::vector<PairingFacts> members;
    for (size_t i = 0; i < rounds.size(); i++)
        members.push_back({.node_id = 100 + i, .round = rounds[i]});
    return members;
}

}  // namespace

TEST_CASE("automatic rounds: H steps until two members said step times that differ past the margin",
          "[pacing]") {
    CHECK(automatic_round_seconds({}, 12, 0.25, false) == 0.0);
    CHECK(automatic_round_seconds({0.1}, 12, 0.25, false) == 0.0);
    CHECK(automatic_round_seconds({0.5, 0.625}, 12, 0.25, false) == 0.0);  // exactly 1.25 times
    CHECK(automatic_round_seconds({0.5, 0.6, 0.55}, 12, 0.25, false) == 0.0);
    const double inf = std::numeric_limits<double>::infinity();
    CHECK(automatic_round_seconds({0.01, 10.0}, 12, inf, false) == 0.0);
    CHECK(automatic_round_seconds({0.5, 0.5}, 12, 0.0, false) == 0.0);
}

TEST_CASE("automatic rounds: past the margin, H times the median member's step time", "[pacing]") {
    // Odd count: the middle one, whatever the order.
    CHECK(automatic_round_seconds({0.4, 0.1, 0.1}, 12, 0.25, false) == Approx(1.2));
    CHECK(automatic_round_seconds({0.5, 0.75, 2.0}, 10, 0.25, false) == Approx(7.5));
    // Even count: the mean of the middle two.
    CHECK(automatic_round_seconds({0.4, 0.1, 0.2, 0.3}, 12, 0.25, false) == Approx(3.0));
    CHECK(automatic_round_seconds({0.5, 0.63}, 8, 0.25, false) == Approx(4.52));
    // Any spread at all once the margin is 0.
    CHECK(automatic_round_seconds({0.5, 0.51}, 4, 0.0, false) == Approx(2.02));
}

TEST_CASE(
    "automatic rounds: a budget, once taken, is kept until the spread is within half the "
    "margin",
    "[pacing]") {
    // 1.2 times: H steps from H steps, and a budget kept from a budget.
    CHECK(automatic_round_seconds({0.5, 0.6}, 10, 0.25, false) == 0.0);
    CHECK(automatic_round_seconds({0.5, 0.6}, 10, 0.25, true) == Approx(5.5));
    // 1.125 times is half the margin: back to H steps.
    CHECK(automatic_round_seconds({0.5, 0.5625}, 10, 0.25, true) == 0.0);
    CHECK(automatic_round_seconds({0.6, 0.5}, 10, 0.25, true) == Approx(5.5));
    CHECK(automatic_round_seconds({0.1}, 10, 0.25, true) == 0.0);
}

TEST_CASE("a phase's steps: H without a budget, else what fits it, between 1 and 16 H",
          "[pacing]") {
    CHECK(phase_steps_in(0.0, 0.5, 10) == 10);
    CHECK(phase_steps_in(5.0, 0.0, 10) == 10);  // step time not known yet
    CHECK(phase_steps_in(5.0, 0.5, 10) == 10);
    CHECK(phase_steps_in(5.0, 0.4, 10) == 13);  // 12.5 rounds up
    CHECK(phase_steps_in(5.0, 0.6, 10) == 8);   // 8.33
    CHECK(phase_steps_in(5.0, 60.0, 10) == 1);
    CHECK(phase_steps_in(500.0, 0.1, 10) == 160);
}

TEST_CASE(
    "catching up: a skip within the gap for a node that pairs, past it a skip when a copy cost "
    "more, else a copy",
    "[pacing]") {
    CHECK(median_round({}) == std::nullopt);
    CHECK(median_round(at_rounds({7, 3, 9})) == 7u);
    CHECK(median_round(at_rounds({7, 3, 9, 12})) == 9u);  // the upper middle of an even count
    CHECK(catch_up(std::nullopt, 3, 1, std::nullopt, true) == CatchUp::None);
    CHECK(catch_up(12, 12, 1, std::nullopt, true) == CatchUp::None);  // in step
    CHECK(catch_up(12, 13, 1, std::nullopt, true) == CatchUp::None);  // ahead
    // A round behind, within the gap: one that pairs would find everyone done with its rounds.
    CHECK(catch_up(12, 11, 1, std::nullopt, true) == CatchUp::Skip);
    CHECK(catch_up(12, 11, 1, std::nullopt, false) == CatchUp::None);
    CHECK(catch_up(13, 10, 3, std::nullopt, true) == CatchUp::Skip);
    CHECK(catch_up(13, 10, 3, std::nullopt, false) == CatchUp::None);
    // Past the gap: 2 behind with gap 1.
    CHECK(catch_up(12, 10, 1, std::nullopt, true) == CatchUp::Copy);
    CHECK(catch_up(12, 10, 1, std::nullopt, false) == CatchUp::Copy);
    CHECK(catch_up(12, 10, 1, 2, false) == CatchUp::Skip);  // 2 behind, a copy cost 2
    CHECK(catch_up(13, 10, 1, 2, true) == CatchUp::Copy);   // 3 behind
}

TEST_CASE("after a state copy: the round after the median's for a node that pairs", "[pacing]") {
    CHECK(round_after_copy(std::nullopt, 5, 1, true) == std::nullopt);
    // Copied at 8 while the median member trains 8: from 9, to start beside the members' next
    // phase.
    CHECK(round_after_copy(8, 8, 1, true) == 9u);
    CHECK(round_after_copy(8, 6, 1, true) == 9u);
    CHECK(round_after_copy(8, 9, 1, true) == std::nullopt);  // at that round already
    // A node that does not pair goes on from the median only past the gap, as catch_up.
    CHECK(round_after_copy(8, 7, 1, false) == std::nullopt);
    CHECK(round_after_copy(8, 6, 1, false) == 8u);
}

TEST_CASE("pacing: a member trains the round after the one it advertises once it has chosen for it",
          "[pacing]") {
    const auto at = [](uint64_t round, uint64_t paired_through, uint64_t solo_through) {
        return PairingFacts{1, round, paired_through, solo_through, true, true};
    };
    CHECK(training_round(at(0, 0, 0)) == 0u);  // fresh: trains round 0
    CHECK(training_round(at(7, 8, 3)) == 8u);  // paired for 7
    CHECK(training_round(at(7, 5, 8)) == 8u);  // solo for 7
    CHECK(training_round(at(7, 7, 0)) == 7u);  // choosing for 7 now, or skipped to it
    CHECK(median_training_round({}) == std::nullopt);
    // Trained rounds 8, 7 and 9: the median is 8, where the advertised rounds' median is 7.
    const std::vector<PairingFacts> swarm{at(7, 8, 0), at(7, 0, 0), at(8, 0, 9)};
    CHECK(median_round(swarm) == 7u);
    CHECK(median_training_round(swarm) == 8u);
}

TEST_CASE("pacing reads the members heard from within a phase, or the 8 heard most lately",
          "[pacing]") {
    using namespace std::chrono_literals;
    const SteadyClock::time_point now = SteadyClock::time_point{} + 1000s;
    // Member 100 + i heard i seconds ago (i = 0: never).
    const auto heard_ago = [&](size_t members) {
        std::vector<PairingFacts> facts = at_rounds(std::vector<uint64_t>(members, 5));
        for (size_t i = 1; i < members; i++) facts[i].heard = now - std::chrono::seconds(i);
        return facts;
    };
    const auto ids = [](std::vector<PairingFacts> facts) {
        std::set<uint64_t> out;
        for (const PairingFacts& m : facts) out.insert(m.node_id);
        return out;
    };
    const auto range = [](uint64_t first, uint64_t last) {
        std::set<uint64_t> out;
        for (uint64_t id = first; id <= last; id++) out.insert(id);
        return out;
    };
    // No more than 8: all of them, heard or not.
    CHECK(ids(heard_lately(heard_ago(8), now, 3.0)) == range(100, 107));
    // 30 members, a phase of 12 s: those heard within 12 s, 101 to 112.
    CHECK(ids(heard_lately(heard_ago(30), now, 12.0)) == range(101, 112));
    // A phase of 3 s: 3 were heard within it, so the 8 heard most lately.
    CHECK(ids(heard_lately(heard_ago(30), now, 3.0)) == range(101, 108));
    // No phase known yet (0): at least 2 s.
    CHECK(ids(heard_lately(heard_ago(30), now, 0.0)) == range(101, 108));
    // Fewer than 8 ever heard: all of them.
    std::vector<PairingFacts> few = heard_ago(30);
    for (size_t i = 8; i < few.size(); i++) few[i].heard = {};
    CHECK(heard_lately(few, now, 12.0).size() == 30u);
    few[8].heard = now - 100s;  // the 8th, heard long ago, completes the 8
    CHECK(ids(heard_lately(few, now, 12.0)) == range(101, 108));
}

TEST_CASE("pacing: ahead of every member by more than the gap; members still to choose",
          "[pacing]") {
    CHECK_FALSE(ahead_of_all({}, 10, 1));  // alone: nobody to wait for
    CHECK(ahead_of_all(at_rounds({8, 7}), 10, 1));
    CHECK_FALSE(ahead_of_all(at_rounds({8, 9}), 10, 1));  // 9 is within reach
    CHECK_FALSE(ahead_of_all(at_rounds({8, 7}), 10, 2));
    // Training round 10: a member advertising 8 has not chosen for 9 yet and is within the gap
    // of 9; one at 9 has; one at 7 is out of reach with gap 1, not with gap 2.
    CHECK(slower_in_reach(at_rounds({8, 9, 7, 10}), 10, 1) == std::vector<uint64_t>{100});
    CHECK(slower_in_reach(at_rounds({8, 9, 7, 10}), 10, 2) == std::vector<uint64_t>{100, 102});
    CHECK(slower_in_reach(at_rounds({8}), 1, 1).empty());
}

TEST_CASE("pacing: a waiting node asks the slower members a hundredth of its phase apart",
          "[pacing]") {
    CHECK(slower_refresh_seconds(5.0) == Approx(0.05));
    CHECK(slower_refresh_seconds(0.5) == 0.01);    // short phases: every 10 ms at most
    CHECK(slower_refresh_seconds(0.0) == 0.01);    // before the first phase is timed
    CHECK(slower_refresh_seconds(100.0) == 0.25);  // long phases: at least 4 times a second
}

TEST_CASE(
    "pacing: a waiting node asks a few slower members at a time, those asked longest ago first",
    "[pacing]") {
    static_assert(kRefreshFanout == 8);
    std::vector<uint64_t> slower(12);
    std::iota(slower.begin(), slower.end(), 10);  // 10 to 21
    std::set<uint64_t> still(slower.begin(), slower.end());
    const auto still_slower = [&](uint64_t id) { return still.contains(id); };
    SlowerWait wait(slower);
    CHECK(wait.next(still_slower) == std::vector<uint64_t>{10, 11, 12, 13, 14, 15, 16, 17});
    // 18 to 21 were never asked; then 10 to 13, asked in the first refresh.
    CHECK(wait.next(still_slower) == std::vector<uint64_t>{18, 19, 20, 21, 10, 11, 12, 13});
    // 14 to 17 were asked in the first refresh, then 18 to 21 in the second, in the order asked.
    CHECK(wait.next(still_slower) == std::vector<uint64_t>{14, 15, 16, 17, 18, 19, 20, 21});
    // 10 and 11 moved on (no longer slower) and are passed over; a member slower only now was not
    // slower when the wait began, and is not waited for.
    still.erase(10);
    still.erase(11);
    still.insert(30);
    CHECK(wait.next(still_slower) == std::vector<uint64_t>{12, 13, 14, 15, 16, 17, 18, 19});
    CHECK_FALSE(wait.over(still_slower));
    // Fewer than the fan-out: all of them, every time.
    still = {14, 20};
    CHECK(wait.next(still_slower) == std::vector<uint64_t>{20, 14});
    CHECK(wait.next(still_slower) == std::vector<uint64_t>{20, 14});
    CHECK_FALSE(wait.over(still_slower));
    still = {14};
    CHECK_FALSE(wait.over(still_slower));
    CHECK(wait.next(still_slower) == std::vector<uint64_t>{14});
    still.clear();
    CHECK(wait.over(still_slower));
    CHECK(wait.next(still_slower).empty());
    CHECK(SlowerWait(std::vector<uint64_t>{}).over(still_slower));
}

TEST_CASE("pacing: a wait looks at each member it drops once, not at every refresh", "[pacing]") {
    // 1,000 slower members of which one stays slower: each refresh and check looks at the front
    // of the queue only, so the whole wait looks about once at each member, and a few times at
    // the one left, where looking at all of them every time would be 1,000 looks per refresh.
    std::vector<uint64_t> slower(1000);
    std::iota(slower.begin(), slower.end(), 0);
    std::set<uint64_t> still(slower.begin(), slower.end());
    size_t looks = 0;
    const auto still_slower = [&](uint64_t id) {
        ++looks;
        return still.contains(id);
    };
    SlowerWait wait(slower);
    CHECK(wait.next(still_slower).size() == 8);
    still = {999};
    for (int refresh = 0; refresh < 100; ++refresh) {
        CHECK(wait.next(still_slower) == std::vector<uint64_t>{999});
        CHECK_FALSE(wait.over(still_slower));
    }
    CHECK(looks <= 1000 + 8 + 200);
    still.clear();
    CHECK(wait.over(still_slower));
}
