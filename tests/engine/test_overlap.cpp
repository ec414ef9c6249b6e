// Where an overlapped round trains from while its exchange runs (engine/overlap.h): the solo
// outer step of each method, against its equation in double, on copies that leave the replica
// as it was; and the landing from there, which is the sequential restart when nothing trained.
#include <catch2/catch.hpp>

#include <cmath>
#include <vector>

#include "engine/overlap.h"
#include "engine/replica.h"
#include "kernels/cpu/cpu_ops.h"
#include "tests/support/compare.h"
#include "tests/support/experiment_configs.h"

using namespace starling;
using starling::test::same_bits;

namespace {

std::vector<float> copy_of(std::span<const float> x) { return {x.begin(), x.end()}; }

struct Case {
    const char* name;
    OuterMethod method;
    MessageMode mode;
    MomentumForm form;
};

}  // namespace

TEST_CASE("the overlapped start is each method's solo outer step, on copies") {
    ExperimentConfig config = test::one_node_experiment();
    config.train.threads = 1;
    config.outer.momentum = 0.6f;
    config.outer.lr = 0.8f;
    config.outer.pull = 0.3f;  // a solo step has no partner's phi to pull towards
    set_cpu_threads(1);
    const Backend backend = make_backend({"cpu", 1, "fp32"});
    Replica replica(config.train, 1, backend, 0, 3);
    replica.inner_phase(config.inner_steps, config.train.lr_schedule());
    std::span<float> momentum = replica.momentum();
    for (size_t i = 0; i < momentum.size(); i++) momentum[i] = 0.01f * std::sin(0.1f * i);
    replica.compute_displacement();
    const std::vector<float> theta = copy_of(replica.theta()), phi = copy_of(replica.phi()),
                             delta = copy_of(replica.momentum());
    const size_t n = replica.size();

    for (const Case& c :
         {Case{"fused noloco", OuterMethod::NoLoCo, MessageMode::Fused, MomentumForm::HeavyBall},
          Case{"split noloco", OuterMethod::NoLoCo, MessageMode::Split, MomentumForm::HeavyBall},
          Case{"diloco, nesterov", OuterMethod::DiLoCo, MessageMode::Fused,
               MomentumForm::Nesterov}}) {
        INFO(c.name);
        config.method = c.method;
        config.exchange.mode = c.mode;
        config.outer.form = c.form;
        std::vector<float> start(n), solo_momentum(n), scratch_a(n), scratch_b(n);
        solo_outer_start(config, replica, theta, start, solo_momentum, scratch_a, scratch_b);
        // delta' = momentum delta + lr (theta - phi); heavy-ball phi + delta', Nesterov
        // phi + lr (theta - phi) + momentum delta'.
        double worst = 0.0;
        for (size_t i = 0; i < n; i++) {
            const double d = double(theta[i]) - double(phi[i]);
            const double next = config.outer.momentum * double(delta[i]) + config.outer.lr * d;
            const double want =
                c.form == MomentumForm::HeavyBall
                    ? double(phi[i]) + next
                    : double(phi[i]) + config.outer.lr * d + config.outer.momentum * next;
            worst = std::max(worst, std::abs(double(start[i]) - want));
            worst = std::max(worst, std::abs(double(solo_momentum[i]) - next));
        }
        CHECK(worst < 1e-6);
        CHECK(same_bits(replica.phi(), phi));  // the exchange's step still has them to itself
        CHECK(same_bits(replica.momentum(), delta));
        CHECK(same_bits(replica.theta(), theta));
    }
}

TEST_CASE("an overlapped phase that lands before any step restarts exactly from the new phi") {
    ExperimentConfig config = test::one_node_experiment();
    config.train.threads = 1;
    set_cpu_threads(1);
    const Backend backend = make_backend({"cpu", 1, "fp32"});
    Replica replica(config.train, 1, backend, 0, 5);
    replica.inner_phase(config.inner_steps, config.train.lr_schedule());
    const size_t n = replica.size();
    std::vector<float> start(n), solo_momentum(n), scratch_a(n), scratch_b(n);
    solo_outer_start(config, replica, replica.theta(), start, solo_momentum, scratch_a, scratch_b);
    std::span<float> phi = replica.phi();
    for (size_t i = 0; i < n; i++) phi[i] = 0.9f * start[i] + 0.01f;  // another step landed
    replica.restart_from(start);
    CHECK(same_bits(replica.theta(), start));
    replica.rebase_onto_phi(start);
    CHECK(same_bits(replica.theta(), replica.phi()));
}
