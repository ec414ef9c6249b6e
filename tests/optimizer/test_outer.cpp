// Outer steps (optimizer/outer.h) against each paper's own update rule, written out in the paper's
// notation and sign in double precision, on small hand-made vectors over several rounds; then the
// fused and solo identities, the group mean, and argument checking.
#include <catch2/catch.hpp>
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <span>
#include <vector>

#include "common/error.h"
#include "optimizer/outer.h"
#include "tests/support/compare.h"
#include "tests/support/determinism.h"
#include "tests/support/outer.h"
#include "tests/support/random.h"

using namespace starling;
using starling::test::as_double;
using starling::test::max_rel_diff;
using starling::test::mean_of;
using starling::test::random_vector;

namespace {

constexpr size_t kElements = 4;
constexpr int kRounds = 5;

// Slow weights of up to three members at the start, different per member so the pull term works.
const std::vector<std::vector<float>> kStartPhi = {
    {1.0f, -0.5f, 0.25f, 2.0f},
    {0.5f, 0.5f, -1.0f, 1.5f},
    {-0.25f, 1.0f, 0.75f, 1.75f},
};

// How far member j's inner phase moves element k in round r (theta = phi + this): both signs,
// several sizes, different every round.
float inner_move(int r, size_t j, size_t k) {
    return static_cast<float>(0.3 * std::sin(1.0 + 1.7 * r + 2.3 * double(j) + 0.9 * double(k)));
}

// Values are of order 1 and a wrong term moves them by about 0.1. Float rounding of the inputs
// (theta - phi loses the low bits of the move) builds up in the momentum, which the high momenta
// multiply by up to 1 / (1 - 0.9).
constexpr double kTol = 1e-5;

double max_abs_diff(const std::vector<float>& a, const std::vector<double>& ref) {
    double diff = 0.0;
    for (size_t i = 0; i < ref.size(); i++) diff = std::max(diff, std::fabs(double(a[i]) - ref[i]));
    return diff;
}

}  // namespace

TEST_CASE("NoLoCo's Eq. 2 with the code's sign is the heavy-ball step with pull") {
    const size_t n = GENERATE(size_t{2}, size_t{3});
    CAPTURE(n);
    const double alpha = 0.5, beta = 0.7, gamma = 0.4;  // gamma != beta: the general split step
    const OuterConfig config{float(alpha), float(beta), float(gamma), MomentumForm::HeavyBall};

    // Reference, literally: delta_i = alpha delta_i + beta mean_j(theta_j - phi_j)
    //                                 - gamma (phi_i - mean_j phi_j);  phi_i += delta_i.
    std::vector<std::vector<double>> phi_ref(n), delta_ref(n, std::vector<double>(kElements, 0.0));
    std::vector<std::vector<float>> phi(n), delta(n, std::vector<float>(kElements, 0.0f));
    for (size_t i = 0; i < n; i++) {
        phi_ref[i] = as_double(kStartPhi[i]);
        phi[i] = kStartPhi[i];
    }
    for (int r = 0; r < kRounds; r++) {
        CAPTURE(r);
        std::vector<std::vector<double>> theta_ref(n, std::vector<double>(kElements));
        std::vector<std::vector<float>> displacement(n, std::vector<float>(kElements));
        for (size_t j = 0; j < n; j++) {
            for (size_t k = 0; k < kElements; k++) {
                theta_ref[j][k] = phi_ref[j][k] + inner_move(r, j, k);
                const float theta = phi[j][k] + inner_move(r, j, k);
                displacement[j][k] = theta - phi[j][k];
            }
        }
        std::vector<std::vector<double>> next_ref = phi_ref;
        for (size_t i = 0; i < n; i++) {
            for (size_t k = 0; k < kElements; k++) {
                double mean_d = 0.0, mean_phi = 0.0;
                for (size_t j = 0; j < n; j++) {
                    mean_d += (theta_ref[j][k] - phi_ref[j][k]) / double(n);
                    mean_phi += phi_ref[j][k] / double(n);
                }
                delta_ref[i][k] =
                    alpha * delta_ref[i][k] + beta * mean_d - gamma * (phi_ref[i][k] - mean_phi);
                next_ref[i][k] = phi_ref[i][k] + delta_ref[i][k];
            }
        }
        phi_ref = next_ref;

        const std::vector<float> mean_d = mean_of(displacement);
        const std::vector<float> mean_phi = mean_of(phi);
        for (size_t i = 0; i < n; i++) outer_step(config, phi[i], delta[i], mean_d, mean_phi);

        for (size_t i = 0; i < n; i++) {
            CAPTURE(i);
            CHECK(max_abs_diff(phi[i], phi_ref[i]) < kTol);
            CHECK(max_abs_diff(delta[i], delta_ref[i]) < kTol);
        }
    }
}

TEST_CASE("DiLoCo's torch Nesterov in DiLoCo's sign is the Nesterov step") {
    const double mu = 0.9, eta = 0.7;
    // pull is set but must not act: every worker shares phi, so mean_phi is left empty.
    const OuterConfig config{float(mu), float(eta), 0.7f, MomentumForm::Nesterov};
    const size_t workers = 3;

    // Reference, literally: Delta = mean_i(phi - theta_i); b = mu b + Delta;
    //                       phi = phi - eta (Delta + mu b).
    std::vector<double> phi_ref = as_double(kStartPhi[0]), b(kElements, 0.0);
    std::vector<float> phi = kStartPhi[0], delta(kElements, 0.0f);
    for (int r = 0; r < kRounds; r++) {
        CAPTURE(r);
        std::vector<std::vector<float>> displacement(workers, std::vector<float>(kElements));
        for (size_t k = 0; k < kElements; k++) {
            double outer_gradient = 0.0;
            for (size_t i = 0; i < workers; i++) {
                const double theta_ref = phi_ref[k] + inner_move(r, i, k);
                outer_gradient += (phi_ref[k] - theta_ref) / double(workers);
                displacement[i][k] = (phi[k] + inner_move(r, i, k)) - phi[k];
            }
            b[k] = mu * b[k] + outer_gradient;
            phi_ref[k] = phi_ref[k] - eta * (outer_gradient + mu * b[k]);
        }
        outer_step(config, phi, delta, mean_of(displacement), {});

        CHECK(max_abs_diff(phi, phi_ref) < kTol);
        // The momenta differ by the factor -eta (outer.h: delta = -eta b).
        std::vector<double> scaled_b(kElements);
        for (size_t k = 0; k < kElements; k++) scaled_b[k] = -eta * b[k];
        CHECK(max_abs_diff(delta, scaled_b) < kTol);
    }
}

TEST_CASE("the heavy-ball DiLoCo of NoLoCo's code is the heavy-ball step") {
    const double mu = 0.3, lr = 0.7;
    const OuterConfig config{float(mu), float(lr), 0.7f, MomentumForm::HeavyBall};
    const size_t workers = 3;

    // Reference, literally: m = mu m - lr mean(phi - theta); phi += m.
    std::vector<double> phi_ref = as_double(kStartPhi[1]), m(kElements, 0.0);
    std::vector<float> phi = kStartPhi[1], delta(kElements, 0.0f);
    for (int r = 0; r < kRounds; r++) {
        CAPTURE(r);
        std::vector<std::vector<float>> displacement(workers, std::vector<float>(kElements));
        for (size_t k = 0; k < kElements; k++) {
            double mean = 0.0;
            for (size_t i = 0; i < workers; i++) {
                const double theta_ref = phi_ref[k] + inner_move(r, i, k);
                mean += (phi_ref[k] - theta_ref) / double(workers);
                displacement[i][k] = (phi[k] + inner_move(r, i, k)) - phi[k];
            }
            m[k] = mu * m[k] - lr * mean;
            phi_ref[k] += m[k];
        }
        outer_step(config, phi, delta, mean_of(displacement), {});

        CHECK(max_abs_diff(phi, phi_ref) < kTol);
        CHECK(max_abs_diff(delta, m) < kTol);
    }
}

TEST_CASE("the fused step equals the split step when pull == lr") {
    const MomentumForm form = GENERATE(MomentumForm::HeavyBall, MomentumForm::Nesterov);
    CAPTURE(momentum_form_name(form));
    const OuterConfig config{0.5f, 0.7f, 0.7f, form};
    const size_t n = 257;
    // Two members with different phis; the fused side sees only their thetas. Each round both
    // sides step from the same phi and momentum, so only that step's rounding separates them.
    std::vector<float> phi = random_vector<float>(n, 1), delta(n, 0.0f);
    for (int r = 0; r < kRounds; r++) {
        CAPTURE(r);
        const std::vector<float> partner_phi = random_vector<float>(n, 2 + r);
        const std::vector<float> move_a = random_vector<float>(n, 10 + r, -0.1, 0.1);
        const std::vector<float> move_b = random_vector<float>(n, 20 + r, -0.1, 0.1);
        std::vector<float> theta_a(n), theta_b(n), d_a(n), d_b(n);
        for (size_t k = 0; k < n; k++) {
            theta_a[k] = phi[k] + move_a[k];
            theta_b[k] = partner_phi[k] + move_b[k];
            d_a[k] = theta_a[k] - phi[k];
            d_b[k] = theta_b[k] - partner_phi[k];
        }
        std::vector<float> split_phi = phi, split_delta = delta;
        const std::vector<float> mean_phi = mean_of({phi, partner_phi});
        outer_step(config, split_phi, split_delta, mean_of({d_a, d_b}), mean_phi);
        outer_step_towards(config, phi, delta, mean_of({theta_a, theta_b}));
        CHECK(max_rel_diff(phi, as_double(split_phi)) < 1e-6);
        CHECK(max_rel_diff(delta, as_double(split_delta)) < 1e-6);
    }
}

TEST_CASE("a solo fused step (own theta) is the plain step on the own displacement") {
    const MomentumForm form = GENERATE(MomentumForm::HeavyBall, MomentumForm::Nesterov);
    CAPTURE(momentum_form_name(form));
    const OuterConfig config{0.5f, 0.7f, 1.3f, form};  // pull != lr: it must vanish anyway
    const size_t n = 100;
    std::vector<float> towards_phi = random_vector<float>(n, 3), plain_phi = towards_phi;
    std::vector<float> towards_delta(n, 0.0f), plain_delta(n, 0.0f);
    for (int r = 0; r < kRounds; r++) {
        const std::vector<float> move = random_vector<float>(n, 40 + r, -0.2, 0.2);
        std::vector<float> theta(n), d(n);
        for (size_t k = 0; k < n; k++) {
            theta[k] = towards_phi[k] + move[k];
            d[k] = theta[k] - towards_phi[k];
        }
        outer_step_towards(config, towards_phi, towards_delta, theta);
        outer_step(config, plain_phi, plain_delta, d, {});
        CHECK(max_rel_diff(towards_phi, as_double(plain_phi)) < 1e-6);
        CHECK(max_rel_diff(towards_delta, as_double(plain_delta)) < 1e-6);
    }
}

TEST_CASE("group_mean is the mean up to rounding, in any order of the members") {
    // Magnitudes far apart, so the order of the float sums shows in the last bits.
    const size_t n = 1000;
    std::vector<std::vector<float>> members = {
        random_vector<float>(n, 5, -1e3, 1e3), random_vector<float>(n, 6),
        random_vector<float>(n, 7, -1e-3, 1e-3), random_vector<float>(n, 8, -10.0, 10.0)};
    std::vector<double> reference(n, 0.0), largest(n, 0.0);
    for (const auto& m : members) {
        for (size_t i = 0; i < n; i++) {
            reference[i] += double(m[i]) / double(members.size());
            largest[i] = std::max(largest[i], std::fabs(double(m[i])));
        }
    }
    const std::vector<float> forward = mean_of(members);
    const std::vector<float> backward = mean_of({members[3], members[2], members[1], members[0]});
    // Three float additions, whose results are at most 2, 3 and 4 times the largest term L, each
    // rounded to within 2^-24 of itself; dividing by 4 is exact: within 9 * 2^-24 / 4 = 1.34e-7 L.
    for (size_t i = 0; i < n; i++) {
        INFO("element " << i);
        REQUIRE(std::fabs(double(forward[i]) - reference[i]) <= 1.5e-7 * largest[i]);
        REQUIRE(std::fabs(double(backward[i]) - reference[i]) <= 1.5e-7 * largest[i]);
    }
    // One member is itself.
    CHECK(mean_of({members[1]}) == members[1]);
}

TEST_CASE("group_mean and outer_step give the same bits on one thread and two") {
    const size_t n = 50'000;  // large enough to be split between threads
    const std::vector<float> a = random_vector<float>(n, 9), b = random_vector<float>(n, 10);
    const std::vector<float> c = random_vector<float>(n, 11);
    test::require_same_bits_for_any_thread_count([&] { return mean_of({a, b, c}); });
    for (const MomentumForm form : {MomentumForm::HeavyBall, MomentumForm::Nesterov}) {
        test::require_same_bits_for_any_thread_count([&] {
            std::vector<float> phi = a, delta = b;
            const OuterConfig config{0.9f, 0.7f, 0.4f, form};
            outer_step(config, phi, delta, c, b);
            outer_step_towards(config, phi, delta, c);
            phi.insert(phi.end(), delta.begin(), delta.end());
            return phi;
        });
    }
}

TEST_CASE("group_mean refuses no members and members of another size") {
    std::vector<float> out(3);
    CHECK_THROWS_AS(group_mean(out, {}), Error);
    const std::vector<float> right(3, 1.0f), wrong(4, 1.0f);
    CHECK_THROWS_AS(mean_of({right, wrong}), Error);
    const std::vector<std::span<const float>> spans = {right, right};
    std::vector<float> short_out(2);
    CHECK_THROWS_AS(group_mean(short_out, spans), Error);
}

TEST_CASE("a weighted group_mean is sum_k (w_k / sum w) m_k, and equal weights the plain mean") {
    const std::vector<float> a{1.0f, 2.0f, -4.0f}, b{3.0f, 6.0f, 8.0f};
    const std::vector<std::span<const float>> members{a, b};
    std::vector<float> out(3);
    const std::vector<double> one_to_three{1.0, 3.0};
    group_mean(out, members, one_to_three);
    // By hand: 0.25 a + 0.75 b.
    CHECK(out[0] == Approx(2.5));
    CHECK(out[1] == Approx(5.0));
    CHECK(out[2] == Approx(5.0));

    const std::vector<float> c = random_vector<float>(1001, 7);
    const std::vector<float> d = random_vector<float>(1001, 8);
    const std::vector<std::span<const float>> pair{c, d};
    std::vector<float> plain(c.size()), equal(c.size());
    group_mean(plain, pair);
    const std::vector<double> fives{5.0, 5.0};
    group_mean(equal, pair, fives);
    CHECK(starling::test::same_bits(equal, plain));

    const std::vector<double> one{1.0}, negative{1.0, -1.0}, zero{0.0, 1.0};
    CHECK_THROWS_AS(group_mean(out, members, one), Error);
    CHECK_THROWS_AS(group_mean(out, members, negative), Error);
    CHECK_THROWS_AS(group_mean(out, members, zero), Error);
}

TEST_CASE("outer settings and momentum names are checked") {
    CHECK_NOTHROW(OuterConfig{}.validate());
    CHECK_NOTHROW((OuterConfig{0.0f, 1.0f, 0.0f, MomentumForm::Nesterov}.validate()));
    const float nan = std::numeric_limits<float>::quiet_NaN();
    const float inf = std::numeric_limits<float>::infinity();
    const auto heavy_ball = [](float momentum, float lr, float pull) {
        return OuterConfig{momentum, lr, pull, MomentumForm::HeavyBall};
    };
    CHECK_THROWS_WITH(heavy_ball(1.0f, 0.7f, 0.7f).validate(), Catch::Contains("momentum"));
    CHECK_THROWS_WITH(heavy_ball(-0.1f, 0.7f, 0.7f).validate(), Catch::Contains("momentum"));
    CHECK_THROWS_WITH(heavy_ball(nan, 0.7f, 0.7f).validate(), Catch::Contains("momentum"));
    CHECK_THROWS_WITH(heavy_ball(0.5f, 0.0f, 0.7f).validate(), Catch::Contains("lr"));
    CHECK_THROWS_WITH(heavy_ball(0.5f, nan, 0.7f).validate(), Catch::Contains("lr"));
    CHECK_THROWS_WITH(heavy_ball(0.5f, inf, 0.7f).validate(), Catch::Contains("lr"));
    CHECK_THROWS_WITH(heavy_ball(0.5f, 0.7f, -0.1f).validate(), Catch::Contains("pull"));
    CHECK_THROWS_WITH(heavy_ball(0.5f, 0.7f, nan).validate(), Catch::Contains("pull"));

    for (const MomentumForm form : {MomentumForm::HeavyBall, MomentumForm::Nesterov}) {
        CHECK(momentum_form_from_name(momentum_form_name(form)) == form);
    }
    CHECK(momentum_form_name(MomentumForm::Nesterov) == "nesterov");
    CHECK_THROWS_AS(momentum_form_from_name("Nesterov"), Error);
    CHECK_THROWS_AS(momentum_form_from_name("adam"), Error);
}

TEST_CASE("outer steps refuse spans of different sizes") {
    const OuterConfig config;
    std::vector<float> phi(4), delta(4), right(4), wrong(5), short_delta(3);
    CHECK_THROWS_AS(outer_step(config, phi, delta, wrong, {}), Error);
    CHECK_THROWS_AS(outer_step(config, phi, delta, right, wrong), Error);
    CHECK_THROWS_AS(outer_step(config, phi, short_delta, right, {}), Error);
    CHECK_THROWS_AS(outer_step_towards(config, phi, delta, wrong), Error);
    CHECK_THROWS_AS(outer_step_towards(config, phi, short_delta, right), Error);
    // Nothing was written before the refusal.
    CHECK(phi == std::vector<float>(4, 0.0f));
}

TEST_CASE(
    "a delayed outer step rebased onto the new phi is the sequential step: exact with nothing in between") {
    const std::vector<float> phi = random_vector<float>(257, 1);
    const std::vector<float> start = random_vector<float>(257, 2);
    std::vector<float> theta = start;  // nothing trained since the phase started
    rebase_onto_phi<float>(theta, phi, start);
    CHECK(theta == phi);  // bit for bit
}

TEST_CASE(
    "overlapped NoLoCo rounds equal sequential ones in double when inner updates do not depend on the start") {
    // Two members, heavy-ball NoLoCo with pull (Eq. 2 in the code's sign), written out in double.
    // Each round's inner phase adds a fixed vector to theta, split into the part trained before
    // the delayed outer step lands and the part after it. The overlapped members train from where
    // their solo step would put phi (engine/overlap.h) and rebase from there: such updates commute
    // with the rebase, so the overlapped schedule must reproduce the sequential one up to
    // rounding, wherever the phase started.
    constexpr size_t n = 64;
    constexpr int rounds = 6;
    constexpr double alpha = 0.5, beta = 0.7, gamma = 0.7;
    std::vector<std::vector<double>> start(2), early(rounds * 2), late(rounds * 2);
    for (int i = 0; i < 2; i++) start[i] = random_vector<double>(n, 10 + i);
    for (int k = 0; k < rounds * 2; k++) {
        early[k] = random_vector<double>(n, 100 + k);
        late[k] = random_vector<double>(n, 200 + k);
    }
    struct Member {
        std::vector<double> phi, delta, theta;
    };
    const auto outer_round = [&](std::vector<Member>& m) {
        for (size_t j = 0; j < n; j++) {
            const double mean_d =
                0.5 * ((m[0].theta[j] - m[0].phi[j]) + (m[1].theta[j] - m[1].phi[j]));
            const double mean_phi = 0.5 * (m[0].phi[j] + m[1].phi[j]);
            for (Member& x : m)
                x.delta[j] = alpha * x.delta[j] + beta * mean_d - gamma * (x.phi[j] - mean_phi);
        }
        for (Member& x : m)
            for (size_t j = 0; j < n; j++) x.phi[j] += x.delta[j];
    };
    const auto add = [](std::vector<double>& x, const std::vector<double>& u) {
        for (size_t j = 0; j < x.size(); j++) x[j] += u[j];
    };
    std::vector<Member> sequential(2), overlapped(2);
    for (int i = 0; i < 2; i++) {
        sequential[i] = overlapped[i] = {start[i], std::vector<double>(n, 0.0), start[i]};
    }
    std::vector<std::vector<double>> solo_start(2, std::vector<double>(n));
    for (int r = 0; r < rounds; r++) {
        for (int i = 0; i < 2; i++) {
            Member& s = sequential[i];
            s.theta = s.phi;  // the sequential restart
            add(s.theta, early[r * 2 + i]);
            add(s.theta, late[r * 2 + i]);
            Member& o = overlapped[i];
            add(o.theta, early[r * 2 + i]);  // on from the solo start, the outer step in flight
            if (r > 0) rebase_onto_phi<double>(o.theta, o.phi, solo_start[i]);
            add(o.theta, late[r * 2 + i]);
        }
        outer_round(sequential);
        for (int i = 0; i < 2; i++) {
            const Member& o = overlapped[i];
            for (size_t j = 0; j < n; j++)
                solo_start[i][j] = o.phi[j] + alpha * o.delta[j] + beta * (o.theta[j] - o.phi[j]);
        }
        outer_round(overlapped);  // of the thetas sent
        for (int i = 0; i < 2; i++) overlapped[i].theta = solo_start[i];
    }
    for (int i = 0; i < 2; i++) {
        CHECK(max_rel_diff(overlapped[i].phi, sequential[i].phi) < 1e-12);
        CHECK(max_rel_diff(overlapped[i].delta, sequential[i].delta) < 1e-12);
    }
}
