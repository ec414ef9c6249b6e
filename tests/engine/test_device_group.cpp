// Data parallelism among one node's devices (engine/device_group.h), on CPU backends joined by
// HostAllReduce: the same code the GPUs run with NCCL. The reference is one device training on
// the whole batch: a group's step must be that step, its devices' weights must stay bit-identical,
// and whatever sets weights or AdamW state must reach every device.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "common/error.h"
#include "kernels/cpu/cpu_ops.h"
#include "engine/device_group.h"
#include "tests/support/compare.h"
#include "tests/support/model_configs.h"

using namespace starling;
using starling::test::normalized_error;
using starling::test::same_bits;

namespace {

constexpr int kBatch = 4;
constexpr int kSeqLen = 6;
constexpr float kLr = 1e-2f;

Backend cpu_devices(size_t count) {
    set_cpu_threads(1);
    Backend backend;
    for (size_t i = 0; i < count; i++) backend.devices.push_back(std::make_unique<CpuOps<float>>());
    if (count > 1) backend.all_reduce = std::make_unique<HostAllReduce>();
    return backend;
}

std::vector<int32_t> random_tokens(uint64_t seed, int vocab) {
    std::mt19937_64 gen(seed);
    std::vector<int32_t> tokens(static_cast<size_t>(kBatch) * kSeqLen);
    for (int32_t& t : tokens) t = static_cast<int32_t>(gen() % static_cast<uint64_t>(vocab));
    return tokens;
}

// CPU devices hold host memory: arenas are read in place.
std::span<const float> arena(float* p, const DeviceGroup& group) { return {p, group.num_params()}; }

// Weights, AdamW moments and step counts of every device equal the lead's, bit for bit.
void check_devices_agree(DeviceGroup& group) {
    for (size_t r = 1; r < group.devices(); r++) {
        CAPTURE(r);
        CHECK(
            same_bits(arena(group.model(r).params(), group), arena(group.lead().params(), group)));
        CHECK(same_bits(arena(group.adamw(r).m(), group), arena(group.lead_adamw().m(), group)));
        CHECK(same_bits(arena(group.adamw(r).v(), group), arena(group.lead_adamw().v(), group)));
        CHECK(group.adamw(r).steps_taken() == group.lead_adamw().steps_taken());
    }
}

}  // namespace

TEST_CASE("the host all-reduce leaves the element-wise mean in every array", "[device_group]") {
    std::vector<float> a{1.0f, -2.0f, 0.5f, 8.0f}, b{3.0f, 2.0f, 0.25f, -8.0f},
        c{2.0f, 6.0f, 0.0f, 3.0f};
    const std::vector<float*> arrays{a.data(), b.data(), c.data()};
    HostAllReduce().average(arrays, a.size());
    const std::vector<float> mean{2.0f, 2.0f, 0.25f, 1.0f};
    CHECK(a == mean);
    CHECK(b == mean);
    CHECK(c == mean);

    std::vector<float> alone{1.5f, -3.0f};
    const std::vector<float*> one{alone.data()};
    HostAllReduce().average(one, alone.size());
    CHECK(alone == std::vector<float>{1.5f, -3.0f});
}

TEST_CASE("a group's training steps are one device's steps on the whole batch", "[device_group]") {
    const ModelConfig config = test::tiny_model_config();
    const Backend one = cpu_devices(1);
    for (const size_t count : {size_t(2), size_t(4)}) {
        CAPTURE(count);
        const Backend several = cpu_devices(count);
        DeviceGroup group(several, config, AdamWConfig{}, kBatch, kSeqLen);
        DeviceGroup single(one, config, AdamWConfig{}, kBatch, kSeqLen);
        REQUIRE(group.devices() == count);
        group.init_weights(5);
        single.init_weights(5);
        CHECK(
            same_bits(arena(group.lead().params(), group), arena(single.lead().params(), single)));
        check_devices_agree(group);

        for (int step = 0; step < 5; step++) {
            CAPTURE(step);
            const std::vector<int32_t> inputs = random_tokens(100 + step, config.vocab_size);
            const std::vector<int32_t> targets = random_tokens(200 + step, config.vocab_size);
            const DeviceGroup::StepResult want =
                single.train_step(inputs.data(), targets.data(), kLr);
            const DeviceGroup::StepResult got =
                group.train_step(inputs.data(), targets.data(), kLr);
            CHECK(std::fabs(got.loss - want.loss) <= 1e-6 * want.loss);
            CHECK(std::fabs(got.stats.grad_norm - want.stats.grad_norm) <=
                  1e-5 * want.stats.grad_norm);
            // Each device saw only its shard; after the all-reduce each holds the batch's gradient.
            for (size_t r = 0; r < count; r++) {
                CHECK(normalized_error(arena(group.model(r).grads(), group),
                                       arena(single.lead().grads(), single)) < 1e-5);
            }
            CHECK(normalized_error(arena(group.lead().params(), group),
                                   arena(single.lead().params(), single)) < 1e-5);
            // The same step from the same gradient on every device: the same bits everywhere.
            check_devices_agree(group);
        }
        CHECK(group.lead_adamw().steps_taken() == 5);
        const std::vector<int32_t> inputs = random_tokens(7, config.vocab_size);
        const std::vector<int32_t> targets = random_tokens(8, config.vocab_size);
        const double want = single.loss(inputs.data(), targets.data());
        CHECK(std::fabs(group.loss(inputs.data(), targets.data()) - want) <= 1e-5 * want);
    }
}

TEST_CASE("accumulated batches and a gradient scale step a group as they step one device",
          "[device_group]") {
    const ModelConfig config = test::tiny_model_config();
    const Backend one = cpu_devices(1);
    const Backend several = cpu_devices(2);
    DeviceGroup group(several, config, AdamWConfig{}, kBatch, kSeqLen);
    DeviceGroup single(one, config, AdamWConfig{}, kBatch, kSeqLen);
    group.init_weights(3);
    single.init_weights(3);
    for (DeviceGroup* g : {&group, &single}) {
        g->zero_grad();
        for (uint64_t batch = 0; batch < 3; batch++) {
            const std::vector<int32_t> inputs = random_tokens(10 + batch, config.vocab_size);
            const std::vector<int32_t> targets = random_tokens(20 + batch, config.vocab_size);
            g->accumulate_gradients(inputs.data(), targets.data());
        }
        g->step(kLr, 1.0f / 3.0f);
    }
    CHECK(normalized_error(arena(group.lead().grads(), group),
                           arena(single.lead().grads(), single)) < 1e-5);
    CHECK(normalized_error(arena(group.lead().params(), group),
                           arena(single.lead().params(), single)) < 1e-5);
    check_devices_agree(group);
}

TEST_CASE("weights, moments and step counts set on a group reach every device", "[device_group]") {
    const ModelConfig config = test::tiny_model_config();
    const Backend several = cpu_devices(3);
    DeviceGroup group(several, config, AdamWConfig{}, 3, kSeqLen);
    const size_t n = group.num_params();
    std::vector<float> weights(n), m(n), v(n);
    for (size_t i = 0; i < n; i++) {
        weights[i] = 0.001f * static_cast<float>(i);
        m[i] = -0.5f * static_cast<float>(i);
        v[i] = 2.0f + static_cast<float>(i);
    }
    group.set_params(weights.data());
    group.set_moments(m.data(), v.data());
    group.set_steps_taken(41);
    for (size_t r = 0; r < group.devices(); r++) {
        CAPTURE(r);
        CHECK(same_bits(arena(group.model(r).params(), group), weights));
        CHECK(same_bits(arena(group.adamw(r).m(), group), m));
        CHECK(same_bits(arena(group.adamw(r).v(), group), v));
        CHECK(group.adamw(r).steps_taken() == 41);
    }

    DeviceGroup other(several, config, AdamWConfig{}, 3, kSeqLen);
    other.copy_optimizer_state_from(group);
    for (size_t r = 0; r < other.devices(); r++) {
        CHECK(same_bits(arena(other.adamw(r).m(), other), m));
        CHECK(same_bits(arena(other.adamw(r).v(), other), v));
        CHECK(other.adamw(r).steps_taken() == 41);
    }
    const Backend fewer = cpu_devices(1);
    DeviceGroup alone(fewer, config, AdamWConfig{}, 3, kSeqLen);
    CHECK_THROWS_WITH(alone.copy_optimizer_state_from(group),
                      Catch::Contains("from a group of 3 devices to one of 1"));
}

TEST_CASE("a batch that does not split evenly over the devices is refused, naming both",
          "[device_group]") {
    const Backend several = cpu_devices(2);
    CHECK_THROWS_WITH(DeviceGroup(several, test::tiny_model_config(), AdamWConfig{}, 3, kSeqLen),
                      Catch::Contains("batch_size 3 does not split evenly over 2 devices"));
    Backend unjoined = cpu_devices(2);
    unjoined.all_reduce.reset();
    CHECK_THROWS_WITH(DeviceGroup(unjoined, test::tiny_model_config(), AdamWConfig{}, 4, kSeqLen),
                      Catch::Contains("2 devices but no all-reduce"));
}
