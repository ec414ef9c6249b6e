// The sane() check on partners' messages (optimizer/sanity.h), against the properties
// docs/spec.md section 4 asks of it.
#include <catch2/catch.hpp>
#include <cmath>
#include <limits>
#include <vector>

#include "common/error.h"
#include "optimizer/sanity.h"

using namespace starling;

namespace {

// A vector at Euclidean distance `distance` from zero.
std::vector<float> at_distance(double distance) {
    return {static_cast<float>(0.6 * distance), static_cast<float>(-0.8 * distance), 0.0f};
}

const std::vector<float> kZero(3, 0.0f);

}  // namespace

TEST_CASE("sane() refuses values that are not finite or of the wrong size") {
    MessageSanity sanity;
    for (const float bad :
         {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
          -std::numeric_limits<float>::infinity()}) {
        const std::vector<float> decoded = {0.5f, bad, 1.0f};
        const auto reason = sanity.check(decoded, kZero);
        REQUIRE(reason.has_value());
        CHECK_THAT(*reason, Catch::Contains("not finite"));
    }
    const std::vector<float> longer(4, 0.0f);
    CHECK(sanity.check(longer, kZero).has_value());
    CHECK(sanity.check(kZero, longer).has_value());
    CHECK_FALSE(sanity.check(at_distance(1.0), kZero).has_value());
}

TEST_CASE("sane() refuses everything while this node's own values are not finite") {
    MessageSanity sanity(10.0, 3);
    for (int i = 0; i < 3; i++) CHECK_FALSE(sanity.check(at_distance(1.0), kZero).has_value());
    const std::vector<float> broken = {std::numeric_limits<float>::quiet_NaN(), 0.0f, 0.0f};
    const auto reason = sanity.check(kZero, broken);
    REQUIRE(reason.has_value());
    CHECK_THAT(*reason, Catch::Contains("not finite"));
    // The history kept only finite distances: a normal message is still judged and accepted.
    CHECK_FALSE(sanity.check(at_distance(1.5), kZero).has_value());
}

TEST_CASE("sane() refuses a distance far beyond the recent median and accepts a moderate one") {
    MessageSanity sanity(10.0, 8);
    // Distances around 1 fill the window (median 1.1).
    for (double d : {1.0, 1.2, 0.8, 1.1, 0.9, 1.3, 1.15, 1.05}) {
        CHECK_FALSE(sanity.check(at_distance(d), kZero).has_value());
    }
    CHECK_FALSE(sanity.check(at_distance(2.0), kZero).has_value());
    const auto reason = sanity.check(at_distance(100.0), kZero);
    REQUIRE(reason.has_value());
    CHECK_THAT(*reason, Catch::Contains("median"));
    // The distance is measured from this node's own values, not from zero.
    const std::vector<float> own = at_distance(100.0);
    CHECK_FALSE(sanity.check(at_distance(101.0), own).has_value());
}

TEST_CASE("sane() judges distances only once its window is full") {
    // Replicas start from the same weights, so the first distances are tiny (zero in a first
    // round) and must not set the scale for the rest.
    MessageSanity sanity(10.0, 4);
    for (double d : {0.0, 0.0, 1e-6}) CHECK_FALSE(sanity.check(at_distance(d), kZero).has_value());
    CHECK_FALSE(sanity.check(at_distance(1.0), kZero).has_value());  // the fourth fills it
    CHECK(sanity.check(at_distance(1.0), kZero).has_value());        // 1 > 10 * 1e-6
}

TEST_CASE("sane() accepts a lasting change of scale once it dominates the history") {
    MessageSanity sanity(10.0, 8);
    for (int i = 0; i < 8; i++) CHECK_FALSE(sanity.check(at_distance(1.0), kZero).has_value());
    // Refused distances still join the history; once they are the median, they pass.
    CHECK(sanity.check(at_distance(100.0), kZero).has_value());
    bool accepted = false;
    for (int i = 0; i < 8 && !accepted; i++) {
        accepted = !sanity.check(at_distance(100.0), kZero).has_value();
    }
    CHECK(accepted);
}

TEST_CASE("MessageSanity refuses a factor of 1 or less and a window under 3") {
    CHECK_THROWS_AS(MessageSanity(1.0), Error);
    CHECK_THROWS_AS(MessageSanity(0.5), Error);
    CHECK_THROWS_AS(MessageSanity(std::numeric_limits<double>::quiet_NaN()), Error);
    CHECK_THROWS_AS(MessageSanity(10.0, 2), Error);
    CHECK_NOTHROW(MessageSanity(1.5, 3));
}
