// The sane() check on partners' messages (optimizer/sanity.h), against the properties
// docs/spec.md section 4 asks of it.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <limits>
#include <random>
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
        const auto reason = sanity.check(decoded, kZero, 1.0);
        REQUIRE(reason.has_value());
        CHECK_THAT(*reason, Catch::Contains("not finite"));
    }
    const std::vector<float> longer(4, 0.0f);
    CHECK(sanity.check(longer, kZero, 1.0).has_value());
    CHECK(sanity.check(kZero, longer, 1.0).has_value());
    CHECK_FALSE(sanity.check(at_distance(1.0), kZero, 1.0).has_value());
}

TEST_CASE("sane() refuses everything while this node's own values are not finite") {
    MessageSanity sanity(10.0, 3);
    for (int i = 0; i < 3; i++) CHECK_FALSE(sanity.check(at_distance(1.0), kZero, 1.0));
    const std::vector<float> broken = {std::numeric_limits<float>::quiet_NaN(), 0.0f, 0.0f};
    const auto reason = sanity.check(kZero, broken, 1.0);
    REQUIRE(reason.has_value());
    CHECK_THAT(*reason, Catch::Contains("not finite"));
    CHECK(sanity.check(at_distance(1.0), kZero, std::numeric_limits<double>::quiet_NaN()));
    // The history kept only finite distances: a normal message is still judged and accepted.
    CHECK_FALSE(sanity.check(at_distance(1.5), kZero, 1.0).has_value());
}

TEST_CASE("sane() judges from the first message on, by this node's own update") {
    // No history yet: a partner one or two updates away passes, a thousand updates away (a
    // learning rate mistyped 1e2 for 1e-2, say) is refused at once.
    MessageSanity sanity(10.0, 8);
    CHECK_FALSE(sanity.check(at_distance(2.0), kZero, 1.0).has_value());
    const auto reason = sanity.check(at_distance(1000.0), kZero, 1.0);
    REQUIRE(reason.has_value());
    CHECK_THAT(*reason, Catch::Contains("own update"));
    // The bound is factor times the update, both sides of it.
    CHECK_FALSE(MessageSanity(10.0, 8).check(at_distance(9.9), kZero, 1.0).has_value());
    CHECK(MessageSanity(10.0, 8).check(at_distance(10.1), kZero, 1.0).has_value());
    MessageSanity fresh(10.0, 8);
    // The distance is measured from this node's own values, not from zero.
    const std::vector<float> own = at_distance(100.0);
    CHECK_FALSE(fresh.check(at_distance(101.0), own, 1.0).has_value());
}

TEST_CASE("sane() lets accepted distances grow beyond one update as replicas drift apart") {
    MessageSanity sanity(10.0, 8);
    // Distances that grow to about 10 updates of 0.1 and stay there (median 1.1), accepted step
    // by step; then this node's own update shrinks to 0.01 (a decaying learning rate, say).
    for (double d : {0.2, 0.5, 0.9, 1.0, 1.2, 0.8, 1.1, 0.9, 1.3, 1.15, 1.05}) {
        CHECK_FALSE(sanity.check(at_distance(d), kZero, 0.1).has_value());
    }
    CHECK_FALSE(sanity.check(at_distance(2.0), kZero, 0.01).has_value());
    const auto reason = sanity.check(at_distance(100.0), kZero, 0.01);
    REQUIRE(reason.has_value());
    CHECK_THAT(*reason, Catch::Contains("median accepted distance"));
}

TEST_CASE("sane() keeps refusing a partner that keeps sending outsized messages") {
    // Refused distances never join the history, so repeating them moves nothing.
    MessageSanity sanity(10.0, 8);
    for (int i = 0; i < 8; i++) CHECK_FALSE(sanity.check(at_distance(1.0), kZero, 1.0));
    for (int i = 0; i < 50; i++) CHECK(sanity.check(at_distance(100.0), kZero, 1.0).has_value());
    // A change of scale that this node's own update shares is accepted at once.
    CHECK_FALSE(sanity.check(at_distance(100.0), kZero, 20.0).has_value());
}

TEST_CASE("sane() with no update and no history judges only size and finiteness") {
    // A node that trained no step yet has no scale: it must not refuse every partner.
    MessageSanity sanity(10.0, 8);
    CHECK_FALSE(sanity.check(at_distance(5.0), kZero, 0.0).has_value());
    // That distance is now the history's median: 10 times it is the bound.
    CHECK(sanity.check(at_distance(51.0), kZero, 0.0).has_value());
}

TEST_CASE("MessageSanity refuses a factor of 1 or less and a window under 3") {
    CHECK_THROWS_AS(MessageSanity(1.0), Error);
    CHECK_THROWS_AS(MessageSanity(0.5), Error);
    CHECK_THROWS_AS(MessageSanity(std::numeric_limits<double>::quiet_NaN()), Error);
    CHECK_THROWS_AS(MessageSanity(10.0, 2), Error);
    CHECK_NOTHROW(MessageSanity(1.5, 3));
}

TEST_CASE("far_from_median judges a norm by the median of finite, positive votes on a log scale") {
    const std::vector<double> votes = {4.0, 5.0, 5e11};  // median 5: 0.5 .. 50 pass
    CHECK_FALSE(far_from_median(50.0, votes, 10.0));
    CHECK_FALSE(far_from_median(0.5, votes, 10.0));
    CHECK(far_from_median(50.01, votes, 10.0));
    CHECK(far_from_median(0.49, votes, 10.0));
    const auto above = far_from_median(5e11, votes, 10.0);
    REQUIRE(above);
    CHECK_THAT(*above, Catch::Contains("norm 5e+11") && Catch::Contains("factor of 10") &&
                           Catch::Contains("median 5 of 3"));
    // An even count: the geometric mean of the middle two, sqrt(20 * 500) = 100. A lone donor 25
    // times a fresh node's norm passes; 1e11 beside 20 does not (the mean is 1.4e6).
    const std::vector<double> two = {20.0, 500.0};
    CHECK_FALSE(far_from_median(500.0, two, 10.0));
    CHECK_FALSE(far_from_median(999.0, two, 10.0));
    CHECK_FALSE(far_from_median(10.01, two, 10.0));
    CHECK(far_from_median(1001.0, two, 10.0));
    CHECK(far_from_median(9.99, two, 10.0));
    CHECK(far_from_median(1e11, std::vector<double>{20.0, 1e11}, 10.0));

    const double nan = std::numeric_limits<double>::quiet_NaN();
    const double inf = std::numeric_limits<double>::infinity();
    const auto not_finite = far_from_median(inf, votes, 10.0);
    REQUIRE(not_finite);
    CHECK_THAT(*not_finite, Catch::Contains("not finite"));
    CHECK(far_from_median(nan, votes, 10.0));
    CHECK(far_from_median(0.0, votes, 10.0));
    // NaN, infinite and zero votes are no votes: 4, 5 and 5e11 are left.
    const std::vector<double> broken = {nan, inf, 0.0, 4.0, 5.0, 5e11};
    CHECK_FALSE(far_from_median(5.0, broken, 10.0));
    CHECK(far_from_median(5e11, broken, 10.0));
    CHECK_FALSE(far_from_median(1e20, std::vector<double>{nan}, 10.0));  // nothing to judge by
    CHECK_THROWS_AS(far_from_median(1.0, votes, 1.0), Error);
}

TEST_CASE("opposed_update refuses a partner's update far against this node's") {
    // Updates from a shared base (fused NoLoCo: theta - phi); the cosine by hand.
    const std::vector<float> base{1.0f, 2.0f, 3.0f};
    const std::vector<float> own{2.0f, 2.0f, 3.0f};      // update (1, 0, 0)
    const std::vector<float> along{1.5f, 2.5f, 3.0f};    // (0.5, 0.5, 0): cosine 0.707
    const std::vector<float> across{1.0f, 3.0f, 3.0f};   // (0, 1, 0): cosine 0
    const std::vector<float> against{0.2f, 1.6f, 3.0f};  // (-0.8, -0.4, 0): cosine -0.894
    CHECK_FALSE(opposed_update(along, own, base));
    CHECK_FALSE(opposed_update(across, own, base));
    const std::vector<float> noisy{0.7f, 3.0f, 3.0f};  // (-0.3, 1, 0): cosine -0.287
    CHECK_FALSE(opposed_update(noisy, own, base));     // above kMinUpdateCosine: noise
    const auto why = opposed_update(against, own, base);
    REQUIRE(why);
    CHECK_THAT(*why, Catch::Contains("points away") && Catch::Contains("-0.894"));
    // Split NoLoCo: the D's themselves, from zero; a node that did not move judges nothing.
    CHECK(opposed_update(std::vector<float>{-1.0f, 0.1f}, std::vector<float>{1.0f, 0.0f}, {}));
    CHECK_FALSE(
        opposed_update(std::vector<float>{-1.0f, 0.1f}, std::vector<float>{0.0f, 0.0f}, {}));
}

TEST_CASE("unaligned_update refuses a D no more aligned with this node's than random signs") {
    // The statistic by hand on 64 coordinates, own D all 1: terms t_i = partner_i, so the sum is
    // the partner's sum and sigma = sqrt(sum of partner_i^2). 40 coordinates at 1 and 24 at -1:
    // sum 16, sigma 8, 2 standard deviations: refused. 52 at 1 and 12 at -1: sum 40, 5: taken.
    const std::vector<float> own(64, 1.0f);
    std::vector<float> weak(64, 1.0f), aligned(64, 1.0f);
    std::fill(weak.begin() + 40, weak.end(), -1.0f);
    std::fill(aligned.begin() + 52, aligned.end(), -1.0f);
    const auto why = unaligned_update(weak, own);
    REQUIRE(why);
    CHECK_THAT(*why,
               Catch::Contains("no more aligned") && Catch::Contains("(2 standard deviations"));
    CHECK_FALSE(unaligned_update(aligned, own));
    std::vector<float> flipped(64);
    std::transform(aligned.begin(), aligned.end(), flipped.begin(), [](float x) { return -x; });
    CHECK_THAT(*unaligned_update(flipped, own), Catch::Contains("(-5 standard deviations"));

    // Noise of a matched norm beside a D of uneven sizes, on 100,000 coordinates: the sum of
    // random-sign terms over sigma is a standard normal, here within 4 of 0, and refused; the
    // same D with that noise at half its norm added (cosine 0.89 with D) passes.
    const size_t n = 100000;
    std::mt19937 rng(7);
    std::normal_distribution<float> normal;
    std::vector<float> d(n), noise(n), honest(n);
    for (size_t i = 0; i < n; i++) d[i] = normal(rng) * (i % 10 == 0 ? 5.0f : 1.0f);
    const double scale = euclidean_distance(d, {});
    for (float& x : noise) x = normal(rng);
    const double noise_scale = scale / euclidean_distance(noise, {});
    for (size_t i = 0; i < n; i++) {
        noise[i] = static_cast<float>(noise[i] * noise_scale);
        honest[i] = d[i] + 0.5f * noise[i];
    }
    CHECK(unaligned_update(noise, d));
    CHECK_FALSE(unaligned_update(honest, d));
    // A sparse D (every 50th coordinate of the honest one) is judged on its own terms.
    std::vector<float> sparse(n, 0.0f);
    for (size_t i = 0; i < n; i += 50) sparse[i] = honest[i];
    CHECK_FALSE(unaligned_update(sparse, d));

    // Under 64 nonzero terms nothing is judged (equal D's score sqrt(count)), nor a zero D
    // (idle_update's) or beside this node's own zero D.
    CHECK_FALSE(unaligned_update(std::vector<float>(63, -1.0f), std::vector<float>(63, 1.0f)));
    CHECK_FALSE(unaligned_update(std::vector<float>(64, 0.0f), own));
    CHECK_FALSE(unaligned_update(weak, std::vector<float>(64, 0.0f)));
}

TEST_CASE("echoed_message refuses values within a twentieth of an update of what was sent") {
    // Distances by hand: sent (1, 2, 2); own update 2, so the bound is 0.1.
    const std::vector<float> sent{1.0f, 2.0f, 2.0f};
    const std::vector<float> rounded{1.0f, 2.0f, 2.0625f};  // 0.0625 away: a re-encoding
    const std::vector<float> honest{1.0f, 2.0f, 2.2f};      // 0.2 away
    const auto why = echoed_message(rounded, sent, 2.0);
    REQUIRE(why);
    CHECK_THAT(*why, Catch::Contains("own message sent back") && Catch::Contains("0.0625"));
    CHECK(echoed_message(sent, sent, 2.0));
    CHECK_FALSE(echoed_message(honest, sent, 2.0));
    // A node that did not move cannot tell an echo from an honest partner that did not either.
    CHECK_FALSE(echoed_message(sent, sent, 0.0));
}
