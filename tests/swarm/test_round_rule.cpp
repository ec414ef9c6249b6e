// The automatic round rule (daemon/swarm/round_rule.h) against budgets worked out by hand.
#include <catch2/catch.hpp>

#include <limits>

#include "daemon/swarm/round_rule.h"

using starling::automatic_round_seconds;

TEST_CASE("automatic rounds: H steps until two members said step times that differ past the margin",
          "[swarm]") {
    CHECK(automatic_round_seconds({}, 12, 0.25, false) == 0.0);
    CHECK(automatic_round_seconds({0.1}, 12, 0.25, false) == 0.0);
    CHECK(automatic_round_seconds({0.5, 0.625}, 12, 0.25, false) == 0.0);  // exactly 1.25 times
    CHECK(automatic_round_seconds({0.5, 0.6, 0.55}, 12, 0.25, false) == 0.0);
    const double inf = std::numeric_limits<double>::infinity();
    CHECK(automatic_round_seconds({0.01, 10.0}, 12, inf, false) == 0.0);
    CHECK(automatic_round_seconds({0.5, 0.5}, 12, 0.0, false) == 0.0);
}

TEST_CASE("automatic rounds: past the margin, H times the median member's step time", "[swarm]") {
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
    "[swarm]") {
    // 1.2 times: H steps from H steps, and a budget kept from a budget.
    CHECK(automatic_round_seconds({0.5, 0.6}, 10, 0.25, false) == 0.0);
    CHECK(automatic_round_seconds({0.5, 0.6}, 10, 0.25, true) == Approx(5.5));
    // 1.125 times is half the margin: back to H steps.
    CHECK(automatic_round_seconds({0.5, 0.5625}, 10, 0.25, true) == 0.0);
    CHECK(automatic_round_seconds({0.6, 0.5}, 10, 0.25, true) == Approx(5.5));
    CHECK(automatic_round_seconds({0.1}, 10, 0.25, true) == 0.0);
}
