#include <catch2/catch.hpp>

#include "common/throttle.h"

using namespace starling;
using namespace std::chrono_literals;

TEST_CASE("a throttle says yes the first time and then once per interval") {
    Throttle throttle(30s);
    const Throttle::Clock::time_point t0{};
    CHECK(throttle.due(t0 + 100s));
    CHECK_FALSE(throttle.due(t0 + 100s));
    CHECK_FALSE(throttle.due(t0 + 129s));
    CHECK(throttle.due(t0 + 130s));  // measured from the last yes, not the first ask
    CHECK_FALSE(throttle.due(t0 + 159s));
    CHECK(throttle.due(t0 + 200s));
}
