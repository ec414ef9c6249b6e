// When starlingd writes a checkpoint: by rounds elapsed since the last one.
#include <catch2/catch.hpp>

#include "daemon/service/node_runner.h"

using starling::checkpoint_due;

TEST_CASE("a checkpoint is due once `every` rounds have passed since the last one") {
    CHECK_FALSE(checkpoint_due(9, std::nullopt, 10));
    CHECK(checkpoint_due(10, std::nullopt, 10));
    CHECK_FALSE(checkpoint_due(19, 10, 10));
    CHECK(checkpoint_due(20, 10, 10));
    // A state copy took the node from round 13 to 42: round % 10 would wait for round 50 and a
    // kill -9 meanwhile would lose everything since round 10.
    CHECK(checkpoint_due(42, 10, 10));
    CHECK(checkpoint_due(43, 10, 10));
    // A failed checkpoint leaves the last one where it was, so the next round tries again.
    CHECK(checkpoint_due(21, 10, 10));
    CHECK_FALSE(checkpoint_due(1000, std::nullopt, 0));
    CHECK(checkpoint_due(1, 0, 1));
}
