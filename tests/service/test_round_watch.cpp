// The watchdog's view of the round loop: healthy while marks come within their allowance.
#include <catch2/catch.hpp>

#include "daemon/service/round_watch.h"

using starling::RoundWatch;
using namespace std::chrono_literals;

TEST_CASE("the round watch is healthy while marks come within the interval plus their allowance") {
    const RoundWatch::Clock::time_point t0{};
    RoundWatch watch(t0);
    const auto interval = std::chrono::microseconds(120s);
    CHECK(watch.healthy(interval, t0 + 120s));
    CHECK_FALSE(watch.healthy(interval, t0 + 121s));  // a step that hangs past WatchdogSec
    CHECK(watch.seconds_since_mark(t0 + 121s) == Approx(121.0));

    watch.mark(15s, t0 + 200s);  // an exchange: up to T_pair + T_xchg more
    CHECK(watch.healthy(interval, t0 + 335s));
    CHECK_FALSE(watch.healthy(interval, t0 + 336s));

    watch.mark(0s, t0 + 300s);  // the next inner step: the allowance ends with the exchange
    CHECK(watch.healthy(interval, t0 + 420s));
    CHECK_FALSE(watch.healthy(interval, t0 + 421s));
}
