// noloco_outer_step: which values enter a node's outer step and in which order.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
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
    CHECK(step.members == 1);
    REQUIRE(step.refused.size() == 1);
    CHECK(step.refused[0].find("0000000000000007") != std::string::npos);
    CHECK(step.refused[0].find("not finite") != std::string::npos);
    // The solo step by hand: delta = 0.5 * delta + 0.7 * (theta - phi); phi += delta.
    for (size_t i = 0; i < n; i++) {
        const float delta = 0.5f * momentum_solo[i] + 0.7f * (theta[i] - phi_solo[i]);
        CHECK(momentum[i] == Approx(delta).epsilon(1e-6));
        CHECK(phi[i] == Approx(phi_solo[i] + delta).epsilon(1e-6));
    }
}

TEST_CASE("noloco_outer_step: the result does not depend on the order partners arrive in") {
    const size_t n = 100;
    const OuterConfig config{0.5f, 0.7f, 0.35f, MomentumForm::Nesterov};
    const std::vector<float> d0 = ramp(n, 0.01f, 1e-3f), d1 = ramp(n, -0.02f, 3e-4f),
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
    const std::vector<float> d0 = ramp(n, 0.01f, 1e-3f), d1 = ramp(n, -0.02f, 3e-4f);
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

    std::vector<float> phi_d = p0, momentum_d(n, 0.0f), scratch(n);
    const std::vector<std::span<const float>> decoded{d0, d1};
    const std::vector<double> weights{10.0, 30.0};
    diloco_outer_step(config, decoded, phi_d, momentum_d, scratch, weights);
    for (size_t i = 0; i < n; i += 7) {
        const double g = 0.7 * (0.25 * d0[i] + 0.75 * d1[i]);
        CHECK(phi_d[i] == Approx(p0[i] + g).epsilon(1e-5));
    }
}

TEST_CASE("message modes by name") {
    CHECK(message_mode_from_name("fused") == MessageMode::Fused);
    CHECK(message_mode_from_name(message_mode_name(MessageMode::Split)) == MessageMode::Split);
    CHECK_THROWS_AS(message_mode_from_name("both"), Error);
}
