// A node's replica on several devices (two CPU backends joined by HostAllReduce, the code path a
// multi-GPU box runs with NCCL) against the same replica on one device: the round code sets
// theta, AdamW's moments and step counts through the replica, and each must reach every device,
// or the devices would drift apart and the node's steps would stop being one model's steps.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "engine/evaluator.h"
#include "experiment/experiment_config.h"
#include "engine/replica.h"
#include "kernels/cpu/cpu_ops.h"
#include "tests/support/compare.h"
#include "tests/support/experiment_configs.h"

using namespace starling;
using starling::test::normalized_error;
using starling::test::same_bits;

namespace {

ExperimentConfig one_node() {
    ExperimentConfig c = test::one_node_experiment();
    c.train.threads = 1;
    c.train.batch_size = 4;
    c.inner_steps = 4;
    return c;
}

Backend two_cpu_devices() {
    Backend backend;
    backend.devices.push_back(std::make_unique<CpuOps<float>>());
    backend.devices.push_back(std::make_unique<CpuOps<float>>());
    backend.all_reduce = std::make_unique<HostAllReduce>();
    return backend;
}

// Every device of the replica holds the lead's weights, moments and step count.
void check_devices_agree(Replica& replica) {
    DeviceGroup& group = replica.device_group();
    const size_t n = group.num_params();
    for (size_t r = 1; r < group.devices(); r++) {
        CAPTURE(r);
        CHECK(same_bits({group.model(r).params(), n}, replica.theta()));
        CHECK(same_bits({group.adamw(r).m(), n}, replica.adamw_m_host()));
        CHECK(same_bits({group.adamw(r).v(), n}, replica.adamw_v_host()));
        CHECK(group.adamw(r).steps_taken() == replica.adamw_steps());
    }
}

}  // namespace

TEST_CASE("a replica on two devices follows one on a single device through its rounds",
          "[replica][devices]") {
    const ExperimentConfig config = one_node();
    const LrSchedule schedule = config.train.lr_schedule();
    const Backend one = make_backend({"cpu", 1, "fp32"});
    const Backend two = two_cpu_devices();
    Replica want(config.train, 1, one, 0, 7);
    Replica got(config.train, 1, two, 0, 7);
    REQUIRE(got.device_group().devices() == 2);
    CHECK(same_bits(got.theta(), want.theta()));
    check_devices_agree(got);

    const double want_loss = want.inner_phase(config.inner_steps, schedule);
    const double got_loss = got.inner_phase(config.inner_steps, schedule);
    CHECK(std::fabs(got_loss - want_loss) <= 1e-5 * want_loss);
    CHECK(normalized_error(got.theta(), want.theta()) < 1e-4);
    CHECK(got.adamw_steps() == config.inner_steps);
    check_devices_agree(got);

    // The round code's writes: a new phi that theta restarts from, and AdamW state adopted from
    // elsewhere (a snapshot), must land on both devices.
    for (Replica* r : {&want, &got}) {
        std::span<float> phi = r->phi();
        for (size_t i = 0; i < phi.size(); i++) phi[i] = 0.5f * phi[i] + 0.25f * r->theta()[i];
        r->restart_from_phi();
        std::vector<float> m(r->adamw_m_host().begin(), r->adamw_m_host().end());
        std::vector<float> v(r->adamw_v_host().begin(), r->adamw_v_host().end());
        for (float& x : m) x *= 0.5f;
        for (float& x : v) x *= 2.0f;
        r->set_adamw_moments(m, v);
        r->set_adamw_steps(100);
    }
    CHECK(same_bits(got.theta(), got.phi()));
    check_devices_agree(got);
    CHECK(got.device_group().adamw(1).steps_taken() == 100);

    // The next phase starts from that state on both devices: the two replicas agree again.
    const double want_next = want.inner_phase(config.inner_steps, schedule);
    const double got_next = got.inner_phase(config.inner_steps, schedule);
    CHECK(std::fabs(got_next - want_next) <= 1e-4 * want_next);
    CHECK(normalized_error(got.theta(), want.theta()) < 1e-4);
    check_devices_agree(got);

    // Rejoining copies a sponsor's optimizer state device by device.
    Replica sponsor(config.train, 1, two, 0, 9);
    sponsor.inner_phase(1, schedule);
    got.rejoin_from(sponsor, 11);
    CHECK(got.adamw_steps() == sponsor.adamw_steps());
    CHECK(same_bits(got.adamw_m_host(), sponsor.adamw_m_host()));
    check_devices_agree(got);
}

TEST_CASE("the evaluator scores weights the same on one device and on two", "[replica][devices]") {
    ExperimentConfig config = one_node();
    config.train.eval_batches = 3;
    const Backend one = make_backend({"cpu", 1, "fp32"});
    const Backend two = two_cpu_devices();
    Evaluator whole(config.train, one);
    Evaluator halves(config.train, two);
    REQUIRE(halves.batches() == 3);
    Replica replica(config.train, 1, one, 0, 7);
    replica.inner_phase(2, config.train.lr_schedule());
    const double want = whole.loss(replica.theta());
    // The two-device evaluator runs each batch as two half batches on the first device.
    CHECK(std::fabs(halves.loss(replica.theta()) - want) <= 1e-9 * want);

    config.train.batch_size = 3;
    CHECK_THROWS_WITH(Evaluator(config.train, two),
                      Catch::Contains("batch_size 3 does not split evenly over 2 devices"));
}

TEST_CASE("a replica's held-out batch is the validation batch after those the evaluator scores",
          "[replica]") {
    // Batch k's loss from the evaluators' means: 3 x mean(0..2) - 2 x mean(0..1) is batch 2's.
    ExperimentConfig config = one_node();
    const Backend one = make_backend({"cpu", 1, "fp32"});
    config.train.eval_batches = 2;
    Replica replica(config.train, 1, one, 0, 7);
    replica.inner_phase(2, config.train.lr_schedule());
    Evaluator first_two(config.train, one);
    config.train.eval_batches = 3;
    Evaluator first_three(config.train, one);
    const double third =
        3.0 * first_three.loss(replica.theta()) - 2.0 * first_two.loss(replica.theta());
    CHECK(std::fabs(replica.held_out_loss(replica.theta()) - third) <= 1e-6 * third);
    // The same batch through the range constructor.
    Evaluator only_third(config.train, one, 2, 1);
    CHECK(std::fabs(only_third.loss(replica.theta()) - third) <= 1e-6 * third);
}
