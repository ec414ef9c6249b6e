// noloco_outer_step: which values enter a node's outer step and in which order.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "common/error.h"
#include "optimizer/outer_round.h"

using namespace starling;

namespace {

std::vector<float> ramp(size_t n, float start, float step) {
    std::vector<float> v(n);
    for (size_t i = 0; i < n; i++) v[i] = start + step * static_cast<float>(i);
    return v;
}

double dot(std::span<const float> a, std::span<const float> b) {
    double s = 0.0;
    for (size_t i = 0; i < a.size(); i++) s += double(a[i]) * b[i];
    return s;
}

// The step refused one partner, `member`, and took `members` values: why it refused it.
std::string why_only_refused(const NoLoCoStep& step, int members, uint64_t member) {
    CHECK(step.members == members);
    REQUIRE(step.refused.size() == 1);
    CHECK(step.refused[0].member == member);
    return step.refused[0].why;
}

// The staleness of each of the first `judged` D's, by hand: its cosine with the momentum less its
// cosine with the sum of the other judged D's, each clipped to the lower median norm of all `ds`.
std::vector<double> staleness_by_hand(const std::vector<std::vector<float>>& ds, size_t judged,
                                      std::span<const float> momentum) {
    std::vector<double> norms;
    for (const auto& d : ds) norms.push_back(std::sqrt(dot(d, d)));
    std::vector<double> sorted = norms;
    std::sort(sorted.begin(), sorted.end());
    const double median_norm = sorted[(sorted.size() - 1) / 2];
    const size_t n = momentum.size();
    std::vector<double> staleness;
    for (size_t m = 0; m < judged; m++) {
        std::vector<float> others(n, 0.0f);
        for (size_t k = 0; k < judged; k++)
            if (k != m)
                for (size_t i = 0; i < n; i++)
                    others[i] += float(ds[k][i] * std::min(1.0, median_norm / norms[k]));
        const double with_momentum =
            dot(ds[m], momentum) / (norms[m] * std::sqrt(dot(momentum, momentum)));
        const double with_others = dot(ds[m], others) / (norms[m] * std::sqrt(dot(others, others)));
        staleness.push_back(with_momentum - with_others);
    }
    return staleness;
}

}  // namespace

TEST_CASE("noloco_outer_step: a partner with a NaN is refused and the node steps alone") {
    const size_t n = 8;
    const OuterConfig config{0.5f, 0.7f, 0.7f, MomentumForm::HeavyBall};
    const std::vector<float> theta = ramp(n, 1.0f, 0.25f);
    std::vector<float> bad = ramp(n, 0.5f, 0.1f);
    bad[3] = NAN;
    std::vector<float> phi = ramp(n, 0.9f, 0.2f), momentum(n, 0.1f), a(n), b(n);
    std::vector<float> phi_solo = phi, momentum_solo = momentum;

    PartnerChecks checks;
    const std::vector<MemberValues> partners{{7, bad, {}}};
    const NoLoCoStep step = noloco_outer_step(config, MessageMode::Fused, {3, theta, phi}, partners,
                                              checks, phi, momentum, a, b);
    const std::string why = why_only_refused(step, 1, 7);
    CHECK(why.find("0000000000000007") != std::string::npos);
    CHECK(why.find("not finite") != std::string::npos);
    // The solo step by hand: delta = 0.5 * delta + 0.7 * (theta - phi); phi += delta.
    for (size_t i = 0; i < n; i++) {
        const float delta = 0.5f * momentum_solo[i] + 0.7f * (theta[i] - phi_solo[i]);
        CHECK(momentum[i] == Approx(delta).epsilon(1e-6));
        CHECK(phi[i] == Approx(phi_solo[i] + delta).epsilon(1e-6));
    }
}

TEST_CASE("noloco_outer_step: a node whose own values are broken leaves partners out unjudged") {
    const size_t n = 8;
    const OuterConfig config{0.0f, 0.7f, 0.7f, MomentumForm::HeavyBall};
    const std::vector<float> phi0 = ramp(n, 0.5f, 0.1f), theta = ramp(n, 0.6f, 0.1f);
    const std::vector<float> partner = ramp(n, 0.62f, 0.1f);
    const std::vector<MemberValues> partners{{7, partner, {}, 10.0}, {9, partner, {}, 10.0}};
    std::vector<float> a(n), b(n);
    SECTION("own values not finite") {
        std::vector<float> own = theta, phi = phi0, momentum(n, 0.0f);
        own[2] = INFINITY;
        PartnerChecks checks;
        const NoLoCoStep step = noloco_outer_step(config, MessageMode::Fused, {3, own, {}, 10.0},
                                                  partners, checks, phi, momentum, a, b);
        CHECK(step.members == 1);
        REQUIRE(step.refused.size() == 2);
        for (const Refusal& r : step.refused) {
            CHECK(r.own_fault);
            CHECK_THAT(r.why, Catch::Contains("not judged: this node's own value 2 is not finite"));
        }
    }
    SECTION("own weights score NaN on the held-out batch, a partner's score finite") {
        std::vector<float> phi = phi0, momentum(n, 0.0f);
        PartnerChecks checks;
        int scored = 0;
        checks.held_out_loss = [&](std::span<const float> w) {
            scored++;
            return w[0] == theta[0] ? std::nan("") : 1.0;
        };
        const NoLoCoStep step = noloco_outer_step(config, MessageMode::Fused, {3, theta, {}, 10.0},
                                                  partners, checks, phi, momentum, a, b);
        CHECK(scored == 1);  // its own weights alone: no partner is scored against NaN
        CHECK(step.members == 1);
        REQUIRE(step.refused.size() == 2);
        for (const Refusal& r : step.refused) {
            CHECK(r.own_fault);
            CHECK_THAT(r.why, Catch::Contains("own weights score nan on the held-out batch"));
        }
    }
    SECTION("a partner whose values are broken is blamed as before") {
        std::vector<float> phi = phi0, momentum(n, 0.0f), bad = partner;
        bad[4] = NAN;
        PartnerChecks checks;
        const std::vector<MemberValues> one{{7, bad, {}, 10.0}};
        const NoLoCoStep step = noloco_outer_step(config, MessageMode::Fused, {3, theta, {}, 10.0},
                                                  one, checks, phi, momentum, a, b);
        REQUIRE(step.refused.size() == 1);
        CHECK_FALSE(step.refused[0].own_fault);
    }
}

TEST_CASE("noloco_outer_step: the result does not depend on the order partners arrive in") {
    const size_t n = 100;
    const OuterConfig config{0.5f, 0.7f, 0.35f, MomentumForm::Nesterov};
    // Partners' D's point roughly the node's way, as replicas of one swarm do.
    const std::vector<float> d0 = ramp(n, 0.01f, 1e-3f), d1 = ramp(n, 0.02f, -1e-4f),
                             d2 = ramp(n, 0.03f, -2e-4f);
    const std::vector<float> p1 = ramp(n, 0.2f, 0.01f), p2 = ramp(n, 0.1f, 0.02f);
    const std::vector<MemberValues> forward{{20, d1, p1}, {30, d2, p2}};
    const std::vector<MemberValues> backward{{30, d2, p2}, {20, d1, p1}};

    auto run = [&](const std::vector<MemberValues>& partners) {
        std::vector<float> phi = ramp(n, 0.15f, 0.015f), momentum(n, 0.0f), a(n), b(n);
        PartnerChecks checks;
        const std::vector<float> own_phi = phi;
        const NoLoCoStep step = noloco_outer_step(config, MessageMode::Split, {10, d0, own_phi},
                                                  partners, checks, phi, momentum, a, b);
        CHECK(step.members == 3);
        return phi;
    };
    const std::vector<float> x = run(forward), y = run(backward);
    CHECK(std::memcmp(x.data(), y.data(), n * sizeof(float)) == 0);
    // And it is the documented step: g = lr mean(D) - pull (phi - mean phi), Nesterov.
    const std::vector<float> phi0 = ramp(n, 0.15f, 0.015f);
    for (size_t i = 0; i < n; i += 17) {
        const double mean_d = (double(d0[i]) + d1[i] + d2[i]) / 3.0;
        const double mean_phi = (double(phi0[i]) + p1[i] + p2[i]) / 3.0;
        const double g = 0.7 * mean_d - 0.35 * (phi0[i] - mean_phi);
        CHECK(x[i] == Approx(phi0[i] + g + 0.5 * g).epsilon(1e-5));
    }
}

TEST_CASE("noloco_outer_step and diloco_outer_step weigh members by the tokens they trained") {
    const size_t n = 64;
    const OuterConfig config{0.5f, 0.7f, 0.35f, MomentumForm::HeavyBall};
    const std::vector<float> d0 = ramp(n, 0.01f, 1e-3f), d1 = ramp(n, 0.02f, -2e-4f);
    const std::vector<float> p0 = ramp(n, 0.15f, 0.015f), p1 = ramp(n, 0.2f, 0.01f);
    std::vector<float> phi = p0, momentum(n, 0.0f), a(n), b(n);
    PartnerChecks checks;
    const std::vector<MemberValues> partner{{20, d1, p1, 30.0}};  // 30 steps against own 10
    const NoLoCoStep step = noloco_outer_step(config, MessageMode::Split, {10, d0, p0, 10.0},
                                              partner, checks, phi, momentum, a, b);
    REQUIRE(step.members == 2);
    for (size_t i = 0; i < n; i += 7) {
        const double mean_d = 0.25 * d0[i] + 0.75 * d1[i];
        const double mean_phi = 0.25 * p0[i] + 0.75 * p1[i];
        const double g = 0.7 * mean_d - 0.35 * (p0[i] - mean_phi);
        CHECK(momentum[i] == Approx(g).epsilon(1e-5));
        CHECK(phi[i] == Approx(p0[i] + g).epsilon(1e-5));
    }

    // DiLoCo: the second D is the first reversed and doubled. Twice the median norm backs a claim
    // of up to 4 times the median tokens and may be up to 3 times the median norm at 30 tokens
    // against 10, so it counts in full and is not clipped.
    std::vector<float> d1_reversed(d0.rbegin(), d0.rend());
    for (float& x : d1_reversed) x *= 2.0f;
    std::vector<float> phi_d = p0, momentum_d(n, 0.0f), scratch(n);
    const std::vector<std::span<const float>> decoded{d0, d1_reversed};
    const std::vector<double> weights{10.0, 30.0};
    const DiLoCoStep diloco =
        diloco_outer_step(config, decoded, phi_d, momentum_d, scratch, weights);
    CHECK(diloco.members == 2);
    CHECK(diloco.clipped.empty());
    for (size_t i = 0; i < n; i += 7) {
        const double g = 0.7 * (0.25 * d0[i] + 0.75 * d1_reversed[i]);
        CHECK(phi_d[i] == Approx(p0[i] + g).epsilon(1e-5));
    }
}

TEST_CASE("noloco_outer_step refuses a partner a thousand updates away in the first round") {
    // Fused: the node's own update is theta - phi; the partner's theta is phi + 1000 of them.
    const size_t n = 32;
    const OuterConfig config{0.0f, 0.7f, 0.7f, MomentumForm::HeavyBall};
    const std::vector<float> phi0 = ramp(n, 0.1f, 0.01f), update = ramp(n, 1e-3f, -5e-5f);
    std::vector<float> theta(n), wild(n), honest(n);
    for (size_t i = 0; i < n; i++) {
        theta[i] = phi0[i] + update[i];
        wild[i] = phi0[i] + 1000.0f * update[i];
        honest[i] = phi0[i] + 2.0f * update[i];  // trained on other data: one update away
    }
    std::vector<float> phi = phi0, momentum(n, 0.0f), a(n), b(n);
    PartnerChecks checks;
    const std::vector<MemberValues> partners{{5, wild, {}}, {9, honest, {}}};
    const NoLoCoStep step = noloco_outer_step(config, MessageMode::Fused, {3, theta, {}}, partners,
                                              checks, phi, momentum, a, b);
    CHECK(why_only_refused(step, 2, 5).find("0000000000000005") != std::string::npos);
}

TEST_CASE("noloco_outer_step refuses a flipped update where both trained the same tokens") {
    // Fused: the partner's theta is phi minus this node's update, a flip of it.
    const size_t n = 32;
    const OuterConfig config{0.0f, 0.7f, 0.7f, MomentumForm::HeavyBall};
    const std::vector<float> phi0 = ramp(n, 0.1f, 0.01f), update = ramp(n, 1e-3f, 2e-5f);
    std::vector<float> theta(n), flipped(n);
    for (size_t i = 0; i < n; i++) {
        theta[i] = phi0[i] + update[i];
        flipped[i] = phi0[i] - update[i];
    }
    std::vector<float> phi = phi0, momentum(n, 0.0f), a(n), b(n);
    PartnerChecks checks;
    const std::vector<MemberValues> same{{5, flipped, {}, 10.0}};
    const NoLoCoStep step = noloco_outer_step(config, MessageMode::Fused, {3, theta, {}, 10.0},
                                              same, checks, phi, momentum, a, b);
    CHECK(step.members == 1);
    REQUIRE(step.refused.size() == 1);
    CHECK_THAT(step.refused[0].why, Catch::Contains("points away"));
    // A partner that trained other tokens (a token-budget round) is judged by distance alone.
    phi = phi0;
    const std::vector<MemberValues> other{{5, flipped, {}, 30.0}};
    CHECK(noloco_outer_step(config, MessageMode::Fused, {3, theta, {}, 10.0}, other, checks, phi,
                            momentum, a, b)
              .members == 2);
}

TEST_CASE("noloco_outer_step refuses this node's own message sent back, fused and split") {
    // The node sent its values rounded (as a codec does); the echo is that, re-encoded. An honest
    // partner a quarter of an update away is taken.
    const size_t n = 32;
    const OuterConfig config{0.0f, 0.7f, 0.7f, MomentumForm::HeavyBall};
    const std::vector<float> phi0 = ramp(n, 0.1f, 0.01f), update = ramp(n, 1e-3f, 2e-5f);
    std::vector<float> theta(n), sent(n), honest(n);
    for (size_t i = 0; i < n; i++) {
        theta[i] = phi0[i] + update[i];
        sent[i] = theta[i] + (i % 2 ? 1e-6f : -1e-6f);
        honest[i] = theta[i] + (i % 3 ? 0.25f : -0.25f) * update[i];
    }
    for (const MessageMode mode : {MessageMode::Fused, MessageMode::Split}) {
        const bool fused = mode == MessageMode::Fused;
        // Split carries D: the same values less phi, and the partners' phi is this node's.
        std::vector<float> own = theta, own_sent = sent, partner = honest;
        if (!fused)
            for (size_t i = 0; i < n; i++) {
                own[i] -= phi0[i];
                own_sent[i] -= phi0[i];
                partner[i] -= phi0[i];
            }
        MemberValues self{3, own, fused ? std::span<const float>() : phi0};
        self.sent = own_sent;
        const std::span<const float> partner_phi = fused ? std::span<const float>() : phi0;
        std::vector<float> phi = phi0, momentum(n, 0.0f), a(n), b(n);
        PartnerChecks checks;
        const std::vector<MemberValues> echo{{5, own_sent, partner_phi}};
        const NoLoCoStep refused =
            noloco_outer_step(config, mode, self, echo, checks, phi, momentum, a, b);
        CHECK(refused.members == 1);
        REQUIRE(refused.refused.size() == 1);
        CHECK_THAT(refused.refused[0].why,
                   Catch::Contains("0000000000000005") && Catch::Contains("own message sent back"));
        phi = phi0;
        const std::vector<MemberValues> other{{5, partner, partner_phi}};
        CHECK(noloco_outer_step(config, mode, self, other, checks, phi, momentum, a, b).members ==
              2);
        // Without what it sent, the node cannot tell: the echo is taken.
        phi = phi0;
        self.sent = {};
        CHECK(noloco_outer_step(config, mode, self, echo, checks, phi, momentum, a, b).members ==
              2);
    }
}

TEST_CASE(
    "noloco_outer_step refuses a split D that barely moved from a partner that trained as much") {
    const size_t n = 8;
    const OuterConfig config{0.0f, 0.7f, 0.7f, MomentumForm::HeavyBall};
    const std::vector<float> phi0(n, 0.5f), own_d(n, 0.25f);  // |own D| = 0.25 sqrt(8)
    std::vector<float> a(n), b(n);
    auto step_with = [&](std::vector<float> partner_d, double partner_tokens) {
        std::vector<float> phi = phi0, momentum(n, 0.0f);
        PartnerChecks checks;
        const std::vector<MemberValues> partners{{9, partner_d, phi0, partner_tokens}};
        return noloco_outer_step(config, MessageMode::Split, {3, own_d, phi0, 10.0}, partners,
                                 checks, phi, momentum, a, b);
    };
    // A D of zero (every step skipped), and one just under a tenth of this node's: refused.
    for (const float x : {0.0f, 0.0249f}) {
        INFO("partner D " << x);
        const NoLoCoStep idle = step_with(std::vector<float>(n, x), 10.0);
        CHECK(idle.members == 1);
        REQUIRE(idle.refused.size() == 1);
        CHECK_FALSE(idle.refused[0].own_fault);
        CHECK_THAT(idle.refused[0].why,
                   Catch::Contains("partner 0000000000000009: its D has a norm") &&
                       Catch::Contains("under 0.1 times this node's own 0.707107"));
    }
    // Just over a tenth is taken, and so is a zero D from a partner that trained fewer tokens.
    CHECK(step_with(std::vector<float>(n, 0.0251f), 10.0).members == 2);
    CHECK(step_with(std::vector<float>(n, 0.0f), 5.0).members == 2);
}

TEST_CASE(
    "noloco_outer_step refuses a split D that its weights' score would pass but points nowhere") {
    // Every weight scores alike on the held-out batch, as noise of an update's norm nearly does:
    // the D's alignment with this node's own tells it apart. Own D alternates 1 and 2 over 256
    // coordinates; the honest partner's is the same; the noise partner's has the signs of a
    // pattern unrelated to it: + on coordinates 0 and 1 of every 4 and - on 2 and 3, so its terms
    // cancel exactly (sum 0), while its weights lie as far from phi as the honest one's.
    const size_t n = 256;
    const OuterConfig config{0.0f, 0.7f, 0.7f, MomentumForm::HeavyBall};
    std::vector<float> own_d(n), noise_d(n);
    for (size_t i = 0; i < n; i++) {
        own_d[i] = i % 2 == 0 ? 1.0f : 2.0f;
        noise_d[i] = i % 4 < 2 ? own_d[i] : -own_d[i];
    }
    const std::vector<float> phi0(n, 0.0f);
    std::vector<float> phi = phi0, momentum(n, 0.0f), a(n), b(n);
    PartnerChecks checks;
    checks.held_out_loss = [](std::span<const float>) { return 1.0; };
    const std::vector<MemberValues> partners{{5, noise_d, phi0, 10.0}, {9, own_d, phi0, 10.0}};
    const NoLoCoStep step = noloco_outer_step(config, MessageMode::Split, {3, own_d, phi0, 10.0},
                                              partners, checks, phi, momentum, a, b);
    CHECK_THAT(why_only_refused(step, 2, 5),
               Catch::Contains("no more aligned") && Catch::Contains("(0 standard deviations"));
    // Where alignment is not judged (sparse TOPK D's), the held-out batch alone judges it.
    checks.judge_alignment = false;
    phi = phi0;
    CHECK(noloco_outer_step(config, MessageMode::Split, {3, own_d, phi0, 10.0}, partners, checks,
                            phi, momentum, a, b)
              .members == 3);
    checks.judge_alignment = true;
    // Fused, theta - phi also holds the partner's drift from this node's phi, so where the
    // held-out batch scores it the same values are taken.
    std::vector<float> theta(n), noise_theta(n);
    for (size_t i = 0; i < n; i++) {
        theta[i] = phi0[i] + own_d[i];
        noise_theta[i] = phi0[i] + noise_d[i];
    }
    phi = phi0;
    std::fill(momentum.begin(), momentum.end(), 0.0f);
    const std::vector<MemberValues> fused{{5, noise_theta, {}, 10.0}};
    CHECK(noloco_outer_step(config, MessageMode::Fused, {3, theta, {}, 10.0}, fused, checks, phi,
                            momentum, a, b)
              .members == 2);
}

TEST_CASE(
    "noloco_outer_step's alignment test stands aside while honest partners score near its bar") {
    // Own D is 1 on 1024 coordinates; a partner's D of 1 with k coordinates at -1 scores
    // (1024 - 2k) / 32 by hand, (1024 - 2k) / 1024 over the root of its 1024 terms: k = 512 is
    // noise (0), k = 432 an honest partner of a late round (5: above the bar of 4, but 0.156 over
    // the root, under the 0.18 the test needs to part honest from noise), k = 0 32 (1).
    const size_t n = 1024;
    const OuterConfig config{0.0f, 0.7f, 0.7f, MomentumForm::HeavyBall};
    const std::vector<float> phi0(n, 0.0f), own_d(n, 1.0f);
    auto scoring = [&](size_t k) {
        std::vector<float> d(n, 1.0f);
        std::fill(d.begin(), d.begin() + static_cast<std::ptrdiff_t>(k), -1.0f);
        return d;
    };
    const std::vector<float> noise = scoring(512), late = scoring(432), aligned = scoring(0);
    std::vector<float> phi(n), momentum(n), a(n), b(n);
    PartnerChecks checks;
    checks.held_out_loss = [](std::span<const float>) { return 1.0; };
    auto step_with = [&](const std::vector<float>& d) {
        phi = phi0;
        std::fill(momentum.begin(), momentum.end(), 0.0f);
        const std::vector<MemberValues> partner{{5, d, phi0, 10.0}};
        return noloco_outer_step(config, MessageMode::Split, {3, own_d, phi0, 10.0}, partner,
                                 checks, phi, momentum, a, b);
    };
    // From the first round, and however many noise messages come: refused partners never join
    // those that say whether the test can tell.
    for (int round = 0; round < 12; round++)
        CHECK_THAT(why_only_refused(step_with(noise), 1, 5), Catch::Contains("(0 standard"));
    // Four late-round partners taken at 5, 0.156 over the root: under 0.18, the test stands aside.
    for (int round = 0; round < 4; round++) CHECK(step_with(late).members == 2);
    CHECK_FALSE(checks.alignment_power.judging());
    CHECK(step_with(noise).members == 2);
    // Aligned partners bring the lower median of the last 8 back to 0.18 or more: judged again.
    for (int round = 0; round < 4; round++) CHECK(step_with(aligned).members == 2);
    CHECK_FALSE(checks.alignment_power.judging());  // 5 5 5 0 32 32 32 32 (scores): 5
    CHECK(step_with(aligned).members == 2);
    CHECK(checks.alignment_power.judging());  // 5 5 0 32 32 32 32 32: 32
    CHECK_THAT(why_only_refused(step_with(noise), 1, 5), Catch::Contains("(0 standard"));
}

TEST_CASE("noloco_outer_step judges a fused update where the partner's update sample says it") {
    // Without the sample, a fused theta - phi holds the partner's drift from this node's phi as
    // well as its update: here the honest partner's phi lies 3 updates against this node's own
    // D, so its theta - phi points away, and the noise partner's lies 3 updates along it, so its
    // theta - phi points the same way, while its update at the sampled coordinates has signs
    // that cancel exactly (+ on the first two of every four sampled coordinates, - on the next
    // two). The sample tells each partner's update from its drift.
    const size_t n = 512;
    const uint64_t round = 3;
    const std::vector<uint64_t> at = sample_coordinates(round, n, 128);
    REQUIRE(at.size() == 128);
    const OuterConfig config{0.0f, 0.7f, 0.7f, MomentumForm::HeavyBall};
    // Values that are sums of quarters, so that every difference below is exact.
    std::vector<float> phi0(n), own_d(n, 1.0f), noise_d(n, 1.0f);
    for (size_t i = 0; i < n; i++) phi0[i] = 0.25f * static_cast<float>(i % 7);
    for (size_t j = 0; j < at.size(); j++)
        if (j % 4 >= 2) noise_d[at[j]] = -1.0f;
    std::vector<float> theta(n), honest_phi(n), honest_theta(n), noise_phi(n), noise_theta(n),
        idle_theta(n);
    for (size_t i = 0; i < n; i++) {
        theta[i] = phi0[i] + own_d[i];
        honest_phi[i] = phi0[i] - 3.0f * own_d[i];
        honest_theta[i] = honest_phi[i] + own_d[i];
        noise_phi[i] = phi0[i] + 3.0f * own_d[i];
        noise_theta[i] = noise_phi[i] + noise_d[i];
        idle_theta[i] = noise_phi[i];
    }
    auto at_sample = [&](const std::vector<float>& values) {
        std::vector<float> sampled;
        for (const uint64_t i : at) sampled.push_back(values[i]);
        return sampled;
    };
    // Each partner's theta and phi at the sample, exact (no rounding: bounds of 0).
    struct Sample {
        std::vector<float> theta, phi, rounding;
    };
    auto sample_of = [&](const std::vector<float>& t, const std::vector<float>& p) {
        return Sample{at_sample(t), at_sample(p), std::vector<float>(at.size(), 0.0f)};
    };
    const Sample honest = sample_of(honest_theta, honest_phi),
                 noise = sample_of(noise_theta, noise_phi), idle = sample_of(idle_theta, noise_phi);
    PartnerChecks checks;
    checks.held_out_loss = [](std::span<const float>) { return 1.0; };
    checks.sample_at = at;
    auto step_with = [&](std::vector<MemberValues> partners) {
        std::vector<float> phi = phi0, momentum(n, 0.0f), a(n), b(n);
        return noloco_outer_step(config, MessageMode::Fused, {3, theta, {}, 10.0}, partners, checks,
                                 phi, momentum, a, b);
    };
    auto partner = [](uint64_t id, std::span<const float> values, const Sample* sample) {
        MemberValues p{.node_id = id, .values = values, .weight = 10.0};
        if (sample) {
            p.sample_theta = sample->theta;
            p.sample_phi = sample->phi;
            p.sample_rounding = sample->rounding;
        }
        return p;
    };
    const NoLoCoStep step =
        step_with({partner(5, noise_theta, &noise), partner(9, honest_theta, &honest)});
    CHECK_THAT(why_only_refused(step, 2, 5),
               Catch::Contains("at its update sample's 128 coordinates") &&
                   Catch::Contains("no more aligned") && Catch::Contains("(0 standard deviations"));
    // Without its sample the noise partner's theta is taken, the held-out batch scoring alike.
    CHECK(step_with({partner(5, noise_theta, nullptr)}).members == 2);
    // A partner that sends its phi as theta did not train: idle, however far its phi drifted.
    CHECK_THAT(why_only_refused(step_with({partner(7, idle_theta, &idle)}), 1, 7),
               Catch::Contains("at its update sample's 128 coordinates") &&
                   Catch::Contains("barely trained"));
    // A sample whose theta is not the one its message carries (here an honest theta sent with
    // noise's message) is refused, and so is one within rounding only where the bound allows it.
    CHECK_THAT(why_only_refused(step_with({partner(5, noise_theta, &honest)}), 1, 5),
               Catch::Contains("the sample is not of the theta it sent"));
    Sample rounded = honest;
    rounded.theta[40] += 0.25f;
    CHECK(why_only_refused(step_with({partner(9, honest_theta, &rounded)}), 1, 9)
              .find("its update sample's theta at coordinate " + std::to_string(at[40])) !=
          std::string::npos);
    rounded.rounding[40] = 0.25f;
    CHECK(step_with({partner(9, honest_theta, &rounded)}).members == 2);
    // A sample that is not finite is refused, not judged.
    Sample broken = honest;
    broken.phi[17] = NAN;
    CHECK_THAT(why_only_refused(step_with({partner(9, honest_theta, &broken)}), 1, 9),
               Catch::Contains("update sample's phi value 17 is not finite"));
}

TEST_CASE("sample_coordinates draws distinct coordinates from the round alone") {
    const uint64_t size = 1000, count = 100;
    const std::vector<uint64_t> a = sample_coordinates(7, size, count);
    REQUIRE(a.size() == count);
    CHECK(std::is_sorted(a.begin(), a.end()));
    CHECK(std::adjacent_find(a.begin(), a.end()) == a.end());
    CHECK(a.back() < size);
    CHECK(sample_coordinates(7, size, count) == a);
    CHECK(sample_coordinates(8, size, count) != a);
    // Every coordinate where the sample is as large as the arena.
    const std::vector<uint64_t> all = sample_coordinates(7, 10, 12);
    CHECK(all == std::vector<uint64_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9});
    // Each coordinate is drawn with probability count / size: over 2,000 rounds each of the 1,000
    // is drawn 200 times in expectation (binomial, standard deviation 13.4).
    std::vector<int> drawn(size, 0);
    for (uint64_t round = 0; round < 2000; round++)
        for (const uint64_t i : sample_coordinates(round, size, count)) drawn[i]++;
    CHECK(*std::min_element(drawn.begin(), drawn.end()) > 200 - 6 * 13.4);
    CHECK(*std::max_element(drawn.begin(), drawn.end()) < 200 + 6 * 13.4);
}

TEST_CASE("noloco_outer_step in a split round without phi averages D's and takes no pull") {
    // Heavy-ball by hand: delta = 0.5 delta + 0.7 mean(D); phi += delta. The partner's phi would
    // have pulled this node's towards it; without one, nothing does.
    const size_t n = 16;
    const OuterConfig config{0.5f, 0.7f, 0.7f, MomentumForm::HeavyBall};
    const std::vector<float> phi0 = ramp(n, 0.1f, 0.01f), own_d = ramp(n, 1e-3f, 1e-4f),
                             partner_d = ramp(n, 2e-3f, -1e-4f), momentum0(n, 1e-3f);
    std::vector<float> phi = phi0, momentum = momentum0, a(n), b(n);
    // The held-out batch scores |w - target|^2: the partner's weights are this node's phi + its D.
    std::vector<float> scored;
    PartnerChecks checks;
    checks.held_out_loss = [&](std::span<const float> w) {
        scored.assign(w.begin(), w.end());
        return 1.0;
    };
    const std::vector<MemberValues> partners{{9, partner_d, {}}};
    const NoLoCoStep step = noloco_outer_step(config, MessageMode::Split, {3, own_d, phi0},
                                              partners, checks, phi, momentum, a, b);
    CHECK(step.members == 2);
    CHECK(step.refused.empty());
    REQUIRE(scored.size() == n);
    for (size_t i = 0; i < n; i++) {
        CHECK(scored[i] == phi0[i] + partner_d[i]);
        const float delta = 0.5f * momentum0[i] + 0.7f * 0.5f * (own_d[i] + partner_d[i]);
        CHECK(momentum[i] == Approx(delta).epsilon(1e-6));
        CHECK(phi[i] == Approx(phi0[i] + delta).epsilon(1e-6));
    }
    // With the partner's phi the same step pulls: phi differs by gamma/2 of the gap, here 0.35.
    std::vector<float> other_phi = phi0;
    for (float& x : other_phi) x += 5e-3f;
    std::vector<float> pulled = phi0, pulled_momentum = momentum0;
    const std::vector<MemberValues> with_phi{{9, partner_d, other_phi}};
    CHECK(noloco_outer_step(config, MessageMode::Split, {3, own_d, phi0}, with_phi, checks, pulled,
                            pulled_momentum, a, b)
              .members == 2);
    for (size_t i = 0; i < n; i++) CHECK(pulled[i] - phi[i] == Approx(0.35 * 5e-3).epsilon(1e-3));
}

TEST_CASE("noloco_outer_step refuses a partner whose weights score worse on the held-out batch") {
    // Split messages: a member's weights are phi + D. The held-out loss here is a quadratic
    // bowl around `best`, so each loss is computed by hand. The partner "garbage" moved as far as
    // this node and not against it (the distance test passes it), but away from the bottom.
    const size_t n = 8;
    const OuterConfig config{0.0f, 0.7f, 0.7f, MomentumForm::HeavyBall};
    const std::vector<float> best(n, 1.0f), phi0(n, 0.75f);
    const std::vector<float> own_d(n, 0.125f), honest_d(n, 0.15625f);
    std::vector<float> garbage_d(n, 0.125f);
    for (size_t i = 0; i < n; i += 2) garbage_d[i] = -0.375f;
    auto bowl = [&](std::span<const float> w) {
        double s = 1.0;
        for (size_t i = 0; i < n; i++) s += (double(w[i]) - best[i]) * (double(w[i]) - best[i]);
        return s;
    };
    std::vector<std::vector<float>> scored;
    PartnerChecks checks;
    checks.held_out_loss = [&](std::span<const float> w) {
        scored.emplace_back(w.begin(), w.end());
        return bowl(w);
    };
    std::vector<float> phi = phi0, momentum(n, 0.0f), a(n), b(n);
    const std::vector<MemberValues> partners{{5, garbage_d, phi0, 10.0}, {9, honest_d, phi0, 10.0}};
    const NoLoCoStep step = noloco_outer_step(config, MessageMode::Split, {3, own_d, phi0, 10.0},
                                              partners, checks, phi, momentum, a, b);
    // Own weights 0.875: 1 + 8 x 0.125^2 = 1.125, the bound 1.05 x 1.125 = 1.18125. Honest
    // weights 0.90625: 1 + 8 x 0.09375^2 = 1.0703125. Garbage 0.375 and 0.875: 1 + 4 x 0.625^2 +
    // 4 x 0.125^2 = 2.625.
    CHECK_THAT(why_only_refused(step, 2, 5),
               Catch::Contains("2.6250 on a held-out batch") && Catch::Contains("own 1.1250"));
    // Own weights once, then each partner's: phi + D.
    REQUIRE(scored.size() == 3);
    CHECK(scored[0] == std::vector<float>(n, 0.875f));
    CHECK(scored[2] == std::vector<float>(n, 0.90625f));
    // Each partner's score over this node's own, in the order given, for the round's log.
    REQUIRE(step.held_out_ratios.size() == 2);
    CHECK(step.held_out_ratios[0] == Approx(2.625 / 1.125));
    CHECK(step.held_out_ratios[1] == Approx(1.0703125 / 1.125));
    // A partner that trained fewer tokens (a token-budget round) is not scored: fewer steps give
    // a worse model honestly...
    phi = phi0;
    scored.clear();
    const std::vector<MemberValues> slower{{5, garbage_d, phi0, 4.0}};
    const NoLoCoStep unscored = noloco_outer_step(
        config, MessageMode::Split, {3, own_d, phi0, 10.0}, slower, checks, phi, momentum, a, b);
    CHECK(unscored.members == 2);
    CHECK(scored.empty());
    REQUIRE(unscored.held_out_ratios.size() == 1);
    CHECK(std::isnan(unscored.held_out_ratios[0]));
    // ...while one that says it trained more is: more steps score no worse honestly.
    phi = phi0;
    scored.clear();
    const std::vector<MemberValues> faster{{5, garbage_d, phi0, 30.0}};
    const NoLoCoStep judged = noloco_outer_step(config, MessageMode::Split, {3, own_d, phi0, 10.0},
                                                faster, checks, phi, momentum, a, b);
    CHECK(judged.members == 1);
    REQUIRE(judged.refused.size() == 1);
    CHECK_THAT(judged.refused[0].why, Catch::Contains("2.6250 on a held-out batch"));
    CHECK(scored.size() == 2);
    // With a held-out batch, the loss judges where the direction test would have: an update
    // against this node's that scores as well is taken.
    phi = phi0;
    const std::vector<float> flipped_d(n, -0.125f), flipped_phi(n, 1.0f);  // weights 0.875
    const std::vector<MemberValues> flipped{{5, flipped_d, flipped_phi, 10.0}};
    CHECK(noloco_outer_step(config, MessageMode::Split, {3, own_d, phi0, 10.0}, flipped, checks,
                            phi, momentum, a, b)
              .members == 2);
}

TEST_CASE("noloco_outer_step scores this node's weights as its partners receive them") {
    // A sparse codec sends a few of D's values: each partner's weights arrive as phi + a sparse D,
    // so set against this node's exact weights an honest partner scores worse. Bowl around 1:
    // exact own weights 1.0 score 1; phi + two of eight values (the rest at 0.75) score
    // 1 + 6 x 0.25^2 = 1.375, own as sent and the partner's alike.
    const size_t n = 8;
    const OuterConfig config{0.0f, 0.7f, 0.7f, MomentumForm::HeavyBall};
    const std::vector<float> phi0(n, 0.75f), own_d(n, 0.25f);
    std::vector<float> own_sent(n, 0.0f), partner_d(n, 0.0f);
    own_sent[0] = own_sent[1] = 0.25f;
    partner_d[2] = partner_d[3] = 0.25f;
    PartnerChecks checks;
    checks.held_out_loss = [&](std::span<const float> w) {
        double s = 1.0;
        for (const float x : w) s += (double(x) - 1.0) * (double(x) - 1.0);
        return s;
    };
    const std::vector<MemberValues> partners{{9, partner_d, phi0}};
    std::vector<float> phi = phi0, momentum(n, 0.0f), a(n), b(n);
    const NoLoCoStep exact = noloco_outer_step(config, MessageMode::Split, {3, own_d, phi0},
                                               partners, checks, phi, momentum, a, b);
    REQUIRE(exact.refused.size() == 1);
    CHECK(exact.held_out_ratios[0] == Approx(1.375));

    MemberValues own{3, own_d, phi0};
    own.sent = own_sent;
    phi = phi0;
    const NoLoCoStep as_sent =
        noloco_outer_step(config, MessageMode::Split, own, partners, checks, phi, momentum, a, b);
    CHECK(as_sent.refused.empty());
    CHECK(as_sent.members == 2);
    CHECK(as_sent.held_out_ratios[0] == Approx(1.0));
    // The mean still takes this node's exact D: the same bits as the unjudged step, which takes
    // every partner and never looks at what was sent.
    PartnerChecks unjudged;
    unjudged.judge = false;
    std::vector<float> reference = phi0, reference_momentum(n, 0.0f);
    noloco_outer_step(config, MessageMode::Split, {3, own_d, phi0}, partners, unjudged, reference,
                      reference_momentum, a, b);
    CHECK(phi == reference);
    CHECK(phi != phi0);
}

TEST_CASE(
    "diloco_outer_step leaves out a D that is not finite or a thousand times the median norm") {
    const size_t n = 16;
    const OuterConfig config{0.0f, 1.0f, 0.0f, MomentumForm::HeavyBall};  // phi += mean D
    const std::vector<float> a = ramp(n, 0.01f, 1e-3f), b = ramp(n, -0.02f, 2e-3f),
                             c = ramp(n, 0.005f, -1e-3f);
    std::vector<float> wild(n), broken = a;
    for (size_t i = 0; i < n; i++) wild[i] = 1000.0f * b[i];
    broken[4] = NAN;
    auto norm = [](const std::vector<float>& v) {
        double s = 0.0;
        for (const float x : v) s += double(x) * x;
        return std::sqrt(s);
    };
    const std::vector<std::span<const float>> decoded{a, broken, c, wild, b};
    const std::vector<float> phi0(n, 0.5f);
    std::vector<float> phi = phi0, momentum(n, 0.0f), scratch(n);
    const DiLoCoStep step = diloco_outer_step(config, decoded, phi, momentum, scratch);
    CHECK(step.members == 3);
    CHECK(step.not_finite == std::vector<size_t>{1});
    CHECK(step.too_large == std::vector<size_t>{3});
    // The median norm of a, c, wild and b (the lower middle one of four) by hand; every D kept
    // above it is scaled to it (section "lets a member that trained more tokens" below: a D twice
    // the median is clipped, not left out).
    std::vector<double> norms{norm(a), norm(c), norm(wild), norm(b)};
    std::sort(norms.begin(), norms.end());
    const double median = norms[1];
    auto clipped = [&](const std::vector<float>& v, size_t i) {
        return norm(v) > median ? v[i] * median / norm(v) : double(v[i]);
    };
    CHECK(step.off_course.empty());  // these D's share no direction: none is off the others'
    for (size_t i = 0; i < n; i++) {
        const double mean = (clipped(a, i) + clipped(c, i) + clipped(b, i)) / 3;
        CHECK(phi[i] == Approx(phi0[i] + mean).epsilon(1e-5).margin(1e-7));
    }

    // With no finite D at all, no step.
    const std::vector<std::span<const float>> none{broken};
    std::vector<float> untouched = phi0;
    CHECK(diloco_outer_step(config, none, untouched, momentum, scratch).members == 0);
    CHECK(untouched == phi0);
}

TEST_CASE("diloco_outer_step on D's of one norm is the plain mean, bit for bit") {
    const size_t n = 40;
    const OuterConfig config{0.3f, 0.7f, 0.0f, MomentumForm::Nesterov};
    const std::vector<float> a = ramp(n, 0.01f, 1e-3f);
    const std::vector<float> b(a.rbegin(), a.rend());
    std::vector<float> c = a;  // a third member that drew the same batches as the first
    const std::vector<std::span<const float>> decoded{a, b, c};
    std::vector<float> phi(n, 0.25f), momentum(n, 0.0f), scratch(n);
    std::vector<float> phi_ref = phi, momentum_ref = momentum, mean(n);
    const DiLoCoStep step = diloco_outer_step(config, decoded, phi, momentum, scratch);
    CHECK(step.clipped.empty());
    CHECK(step.off_course.empty());
    group_mean(mean, decoded);
    outer_step(config, phi_ref, momentum_ref, mean, {});
    CHECK(std::memcmp(phi.data(), phi_ref.data(), n * sizeof(float)) == 0);
}

TEST_CASE("diloco_outer_step leaves out a D that points away from the others'") {
    const size_t n = 48;
    const OuterConfig config{0.0f, 1.0f, 0.0f, MomentumForm::HeavyBall};  // phi += mean D
    // Four honest D's: one trend with each its own wiggle. A fifth is the first sign-flipped, a
    // sixth alternates in sign (of the honest norm, nearly orthogonal to the trend).
    std::vector<std::vector<float>> honest(4, std::vector<float>(n));
    for (size_t k = 0; k < 4; k++)
        for (size_t i = 0; i < n; i++)
            honest[k][i] = 0.01f + 1e-3f * float(i) + 2e-3f * std::sin(float(i * (k + 1)));
    std::vector<float> flipped = honest[0], alternating(n);
    for (float& x : flipped) x = -x;
    for (size_t i = 0; i < n; i++) alternating[i] = (i % 2 ? 1.0f : -1.0f) * honest[1][i];
    const std::vector<std::span<const float>> decoded{honest[0], flipped,     honest[1],
                                                      honest[2], alternating, honest[3]};
    std::vector<float> phi(n, 0.0f), momentum(n, 0.0f), scratch(n);
    const DiLoCoStep step = diloco_outer_step(config, decoded, phi, momentum, scratch);
    CHECK(step.off_course == std::vector<size_t>{1, 4});
    CHECK(step.members == 4);
    CHECK(step.cosines[1] < 0.0);
    CHECK(step.median_cosine > 0.5);
    // The rest, by hand: every D of about one norm; the step is the mean of the honest ones,
    // each clipped to the median norm of all six.
    auto norm = [](std::span<const float> v) {
        double s = 0.0;
        for (const float x : v) s += double(x) * x;
        return std::sqrt(s);
    };
    std::vector<double> norms;
    for (const auto d : decoded) norms.push_back(norm(d));
    std::sort(norms.begin(), norms.end());
    const double median = norms[2];
    for (size_t i = 0; i < n; i++) {
        double mean = 0.0;
        for (const auto& d : honest) mean += d[i] * std::min(1.0, median / norm(d)) / 4.0;
        CHECK(phi[i] == Approx(mean).epsilon(1e-5).margin(1e-7));
    }

    // Two D's make no majority: a flipped partner is only clipped, never judged.
    const std::vector<std::span<const float>> pair{honest[0], flipped};
    std::vector<float> phi_pair(n, 0.0f);
    const DiLoCoStep two = diloco_outer_step(config, pair, phi_pair, momentum, scratch);
    CHECK(two.members == 2);
    CHECK(two.off_course.empty());
    CHECK(std::isnan(two.cosines[0]));
}

TEST_CASE("diloco_outer_step leaves out a D kept back a round") {
    const size_t n = 64;
    const OuterConfig config{0.0f, 1.0f, 0.0f, MomentumForm::HeavyBall};  // phi += mean D
    // The last round's trend and this round's, which has turned: cosine 0.6 between them. Five
    // honest D's follow this round's trend, each with its own wiggle; a sixth is the last round's
    // trend with a wiggle of its own (what a member replaying its earlier D sends). The momentum
    // holds the last step: the last round's trend.
    std::vector<float> last(n), now(n);
    for (size_t i = 0; i < n; i++) {
        const float u = i % 2 ? 1.0f : -1.0f, w = i < n / 2 ? 1.0f : -1.0f;
        last[i] = u;
        now[i] = 0.6f * u + 0.8f * w;
    }
    auto wiggled = [&](const std::vector<float>& trend, size_t k) {
        std::vector<float> d(n);
        for (size_t i = 0; i < n; i++) d[i] = trend[i] + 0.5f * std::sin(float(i * (k + 3)));
        return d;
    };
    std::vector<std::vector<float>> ds;
    for (size_t k = 0; k < 5; k++) ds.push_back(wiggled(now, k));
    ds.insert(ds.begin() + 2, wiggled(last, 7));
    const std::vector<std::span<const float>> decoded(ds.begin(), ds.end());
    std::vector<float> phi(n, 0.0f), momentum = last, scratch(n);
    const DiLoCoStep step = diloco_outer_step(config, decoded, phi, momentum, scratch);
    CHECK(step.stale == std::vector<size_t>{2});
    CHECK(step.off_course.empty());
    CHECK(step.members == 5);

    // Each staleness by hand, against the other five D's.
    std::vector<double> staleness = staleness_by_hand(ds, ds.size(), last);
    for (size_t m = 0; m < ds.size(); m++)
        CHECK(step.staleness[m] == Approx(staleness[m]).margin(1e-4));
    std::sort(staleness.begin(), staleness.end());
    CHECK(step.median_staleness == Approx(staleness[2]).margin(1e-4));
    CHECK(step.staleness[2] > step.median_staleness + 0.5);

    SECTION("where the trend holds, a round-old D is a current one and nobody is left out") {
        std::vector<float> same_momentum = now, phi_same(n, 0.0f);
        std::vector<std::vector<float>> current = ds;
        current[2] = wiggled(now, 7);
        const std::vector<std::span<const float>> all(current.begin(), current.end());
        const DiLoCoStep kept = diloco_outer_step(config, all, phi_same, same_momentum, scratch);
        CHECK(kept.stale.empty());
        CHECK(kept.members == 6);
    }
    SECTION("with no momentum yet, nothing is judged stale") {
        std::vector<float> zero(n, 0.0f), phi_first(n, 0.0f);
        const DiLoCoStep first = diloco_outer_step(config, decoded, phi_first, zero, scratch);
        CHECK(first.stale.empty());
        CHECK(std::isnan(first.staleness[2]));
        CHECK(first.members == 6);
    }
}

TEST_CASE("diloco_outer_step judges staleness among the D's not left out as off course") {
    const size_t n = 64;
    const OuterConfig config{0.0f, 1.0f, 0.0f, MomentumForm::HeavyBall};  // phi += mean D
    // Three honest D's of this round's trend, one of them leaning the last round's way, and a
    // fourth pointing away (noise, a replica trained on random bytes). Judged with the fourth in,
    // the staleness median was the lowest honest one's and the leaning D, 0.30 above it, was left
    // out as a round old; among the three, it is 0.20 above their median, and kept.
    std::vector<float> u(n), w(n), v(n);
    for (size_t i = 0; i < n; i++) {
        u[i] = i % 2 ? 1.0f : -1.0f;
        w[i] = i < n / 2 ? 1.0f : -1.0f;
        v[i] = (i / 2) % 2 ? 1.0f : -1.0f;
    }
    auto d_of = [&](float now, float last, float away, size_t k) {
        std::vector<float> d(n);
        for (size_t i = 0; i < n; i++)
            d[i] = now * (0.6f * u[i] + 0.8f * w[i]) + last * u[i] + away * v[i] +
                   0.5f * std::sin(float(i * (k + 3)));
        return d;
    };
    const std::vector<std::vector<float>> ds{d_of(1.0f, 0.0f, 0.0f, 0), d_of(1.0f, 0.6f, 0.0f, 1),
                                             d_of(1.0f, 0.0f, 0.0f, 2),
                                             d_of(-0.2f, -1.0f, 1.0f, 5)};
    const std::vector<std::span<const float>> decoded(ds.begin(), ds.end());
    std::vector<float> phi(n, 0.0f), momentum = u, scratch(n);
    const DiLoCoStep step = diloco_outer_step(config, decoded, phi, momentum, scratch);
    CHECK(step.off_course == std::vector<size_t>{3});
    CHECK(step.stale.empty());
    CHECK(step.members == 3);
    CHECK(std::isnan(step.staleness[3]));

    // Each honest staleness by hand, against the sum of the other two honest D's, each clipped to
    // the median norm of all four.
    const std::vector<double> staleness = staleness_by_hand(ds, 3, u);
    for (size_t m = 0; m < 3; m++) CHECK(step.staleness[m] == Approx(staleness[m]).margin(1e-4));
    CHECK(step.median_staleness == Approx(staleness[0]).margin(1e-4));
    CHECK(step.staleness[1] > step.median_staleness + 0.15);
}

TEST_CASE("with judge off, the outer steps take every message as it comes") {
    const size_t n = 16;
    const OuterConfig config{0.0f, 1.0f, 1.0f, MomentumForm::HeavyBall};  // phi = the group mean
    const std::vector<float> own = ramp(n, 0.1f, 0.01f);
    std::vector<float> wild = own;
    for (float& x : wild) x *= -1000.0f;
    // NoLoCo: a partner a thousand updates away, pointing against this node, claiming 1e6 tokens
    // against 1, enters at its claim.
    std::vector<float> phi(n, 0.0f), momentum(n, 0.0f), a(n), b(n);
    PartnerChecks checks;
    checks.judge = false;
    const std::vector<MemberValues> partner{{8, wild, {}, 1e6}};
    const NoLoCoStep step = noloco_outer_step(config, MessageMode::Fused, {4, own, {}, 1.0},
                                              partner, checks, phi, momentum, a, b);
    CHECK(step.members == 2);
    CHECK(step.refused.empty());
    for (size_t i = 0; i < n; i++)
        CHECK(phi[i] == Approx((own[i] + 1e6 * wild[i]) / (1.0 + 1e6)).epsilon(1e-5));
    // DiLoCo: the plain mean, the flipped and outsized D included.
    const std::vector<std::span<const float>> decoded{own, own, wild};
    std::vector<float> phi_d(n, 0.0f), momentum_d(n, 0.0f), scratch(n);
    const DiLoCoStep diloco =
        diloco_outer_step(config, decoded, phi_d, momentum_d, scratch, {}, false);
    CHECK(diloco.members == 3);
    CHECK(diloco.clipped.empty());
    CHECK(diloco.off_course.empty());
    for (size_t i = 0; i < n; i++)
        CHECK(phi_d[i] == Approx((2.0 * own[i] + wild[i]) / 3.0).epsilon(1e-5));
}

TEST_CASE("message modes by name") {
    CHECK(message_mode_from_name("fused") == MessageMode::Fused);
    CHECK(message_mode_from_name(message_mode_name(MessageMode::Split)) == MessageMode::Split);
    CHECK_THROWS_AS(message_mode_from_name("both"), Error);
}

TEST_CASE("a claim of tokens counts at most kMaxTokenRatio times the reference") {
    const size_t n = 24;
    const OuterConfig config{0.0f, 1.0f, 1.0f, MomentumForm::HeavyBall};  // phi = the group mean
    const std::vector<float> own = ramp(n, 0.1f, 0.01f), claimed = ramp(n, 0.12f, 0.009f);

    // NoLoCo, fused: a partner claiming a billion tokens against this node's 10 weighs 80.
    std::vector<float> phi = ramp(n, 0.1f, 0.0095f), momentum(n, 0.0f), a(n), b(n);
    PartnerChecks checks;
    const std::vector<MemberValues> liar{{8, claimed, {}, 1e9}};
    REQUIRE(noloco_outer_step(config, MessageMode::Fused, {4, own, {}, 10.0}, liar, checks, phi,
                              momentum, a, b)
                .members == 2);
    for (size_t i = 0; i < n; i++) {
        const double mean =
            (10.0 * own[i] + kMaxTokenRatio * 10.0 * claimed[i]) / (10.0 + kMaxTokenRatio * 10.0);
        CHECK(phi[i] == Approx(mean).epsilon(1e-5));
    }

    // DiLoCo: three members at 10 tokens and two claiming a billion. One sends a D of the others'
    // norm, which backs no more than the median claim: it weighs 10. The other's D is 4 times the
    // median norm, which would back 16 times the median claim: it weighs kMaxTokenRatio times
    // the median, 80, and may be up to 8 times the median norm, so neither is clipped.
    const std::vector<float> d = ramp(n, 0.01f, 1e-3f);
    const std::vector<float> d_reversed(d.rbegin(), d.rend());
    std::vector<float> d_rotated(n), d_shifted(n), d_big(n);
    for (size_t i = 0; i < n; i++) {
        d_rotated[i] = d[(i + 5) % n];
        d_shifted[i] = d[(i + 11) % n];
        d_big[i] = 4.0f * d[(i + 17) % n];
    }
    const std::vector<std::span<const float>> decoded{d, d_reversed, d_rotated, d_shifted, d_big};
    const std::vector<double> weights{10.0, 10.0, 10.0, 1e9, 1e9};
    std::vector<float> phi_d(n, 0.0f), momentum_d(n, 0.0f), scratch(n);
    const DiLoCoStep step = diloco_outer_step(config, decoded, phi_d, momentum_d, scratch, weights);
    REQUIRE(step.members == 5);
    CHECK(step.clipped.empty());
    const double cap = kMaxTokenRatio * 10.0, total = 40.0 + cap;
    for (size_t i = 0; i < n; i++) {
        const double mean =
            (10.0 * (double(d[i]) + d_reversed[i] + d_rotated[i] + d_shifted[i]) + cap * d_big[i]) /
            total;
        CHECK(phi_d[i] == Approx(mean).epsilon(1e-4).margin(1e-6));
    }
}

TEST_CASE("diloco_outer_step lets a member that trained more tokens send a larger D") {
    // Weights 10, 10, 10 and 30: the last may send up to 3 times the median norm unclipped; a
    // member at the median weight sending twice the median norm is held to it.
    const size_t n = 12;
    const OuterConfig config{0.0f, 1.0f, 0.0f, MomentumForm::HeavyBall};
    const std::vector<float> d = ramp(n, 0.01f, 1e-3f);
    std::vector<float> twice = d, reversed(d.rbegin(), d.rend());
    for (float& x : twice) x *= 2.0f;
    std::vector<float> phi(n, 0.0f), momentum(n, 0.0f), scratch(n);
    const std::vector<std::span<const float>> fast{d, reversed, d, twice};
    const std::vector<double> weights{10.0, 10.0, 10.0, 30.0};
    CHECK(diloco_outer_step(config, fast, phi, momentum, scratch, weights).clipped.empty());
    const std::vector<std::span<const float>> loud{d, reversed, twice, d};
    const DiLoCoStep step = diloco_outer_step(config, loud, phi, momentum, scratch, weights);
    CHECK(step.clipped == std::vector<size_t>{2});
}
