// A swarm replica (engine/replica.h) on the GPU against one on the CPU: the round code reads
// theta and AdamW's moments through host views and writes phi and the moments back, and on a GPU
// those are copies of device arenas. Same config, seed, node id and data, so the two must follow
// each other within fp32 differences, and the views must equal what the device holds.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>
#include <vector>

#include "experiment/experiment_config.h"
#include "engine/replica.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cuda/cuda_ops.h"
#include "tests/gpu/cuda_skip.h"
#include "tests/support/compare.h"
#include "tests/support/experiment_configs.h"

using namespace starling;
using starling::test::normalized_error;
using starling::test::same_bits;

TEST_CASE("a replica on the GPU follows one on the CPU through its host views", "[gpu][replica]") {
    STARLING_SKIP_WITHOUT_CUDA();
    const ExperimentConfig config = test::one_node_experiment();
    const LrSchedule schedule = config.train.lr_schedule();
    const Backend cpu = make_backend({"cpu", 0, "fp32"});
    const Backend gpu = make_backend({"cuda:0", 0, "fp32"});
    Replica want(config.train, 1, cpu, 0, 7);
    Replica got(config.train, 1, gpu, 0, 7);
    // Initialisation is a function of (seed, index) computed on the host: the same bits.
    CHECK(same_bits(got.theta(), want.theta()));
    CHECK(same_bits(got.phi(), want.phi()));

    const double want_loss = want.inner_phase(config.inner_steps, schedule);
    const double got_loss = got.inner_phase(config.inner_steps, schedule);
    CHECK(std::fabs(got_loss - want_loss) <= 1e-4 * std::fabs(want_loss));
    // theta moved on the device, and the view followed it.
    CHECK_FALSE(same_bits(got.theta(), got.phi()));
    CHECK(normalized_error(got.theta(), want.theta()) < 1e-4);
    CHECK(normalized_error(got.adamw_m_host(), want.adamw_m_host()) < 1e-3);
    CHECK(normalized_error(got.adamw_v_host(), want.adamw_v_host()) < 1e-3);

    // A round that restarts from phi puts phi on the device: the next phase starts from it on both
    // backends, so they agree again as closely as after the first phase.
    got.restart_from_phi();
    want.restart_from_phi();
    CHECK(same_bits(got.theta(), got.phi()));
    // Moments written from the host are the ones the device then uses.
    const std::vector<float> m(want.adamw_m_host().begin(), want.adamw_m_host().end());
    const std::vector<float> v(want.adamw_v_host().begin(), want.adamw_v_host().end());
    got.set_adamw_moments(m, v);
    CHECK(same_bits(got.adamw_m_host(), m));
    CHECK(same_bits(got.adamw_v_host(), v));
    want.inner_phase(1, schedule);
    got.inner_phase(1, schedule);
    CHECK(normalized_error(got.theta(), want.theta()) < 1e-4);

    // An outer step landing late (overlapped rounds) rebases theta onto phi: with nothing trained
    // since the message was made, theta is phi again, bit for bit, and the device trains on from
    // there as the CPU replica does from its restart.
    const std::vector<float> sent(got.theta().begin(), got.theta().end());
    got.rebase_onto_phi(sent);
    want.restart_from_phi();
    CHECK(same_bits(got.theta(), got.phi()));
    want.inner_phase(1, schedule);
    got.inner_phase(1, schedule);
    CHECK(normalized_error(got.theta(), want.theta()) < 1e-4);
}
