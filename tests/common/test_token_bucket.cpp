// The token bucket at chosen instants, against counts worked out by hand.
#include <catch2/catch.hpp>

#include "common/token_bucket.h"

using namespace starling;
using namespace std::chrono_literals;
using Clock = TokenBucket::Clock;

TEST_CASE("a token bucket gives its burst at once, then its rate, and never more than its burst") {
    const Clock::time_point t0{};
    TokenBucket bucket(4.0, 10.0, t0);  // 4 a second, 10 at most
    CHECK(bucket.take(10, t0));
    CHECK_FALSE(bucket.take(1, t0));
    // Half a second refills 2.
    CHECK_FALSE(bucket.take(3, t0 + 500ms));
    CHECK(bucket.take(2, t0 + 500ms));
    CHECK_FALSE(bucket.take(1, t0 + 500ms));
    // A minute idle fills it to 10, not 240.
    CHECK(bucket.take(10, t0 + 60s));
    CHECK_FALSE(bucket.take(1, t0 + 60s));
    // A refused take takes nothing: 1 s later there are 4, and 4 are there to take.
    CHECK_FALSE(bucket.take(5, t0 + 61s));
    CHECK(bucket.take(4, t0 + 61s));
    // A clock that seems to go back refills nothing.
    CHECK_FALSE(bucket.take(1, t0 + 60s));
}

TEST_CASE("a token bucket taken on credit says how long its debt lasts") {
    // Rates and instants whose sums are exact in binary.
    const Clock::time_point t0{};
    TokenBucket bucket(4.0, 8.0, t0);
    CHECK(bucket.take_on_credit(6, t0) == Clock::duration::zero());  // 2 left
    // 2 - 6 = -4 tokens: one second at 4 a second.
    CHECK(bucket.take_on_credit(6, t0) == 1s);
    CHECK_FALSE(bucket.take(1, t0 + 750ms));  // -1
    // 2 s after the debt began: paid off, and 4 more came in.
    CHECK(bucket.take(4, t0 + 2s));
    CHECK_FALSE(bucket.take(1, t0 + 2s));
    // Debts add up: 8 more at once is 2 s of the rate, 4 after them 1 s more.
    CHECK(bucket.take_on_credit(8, t0 + 2s) == 2s);
    CHECK(bucket.take_on_credit(4, t0 + 2s) == 3s);
}
