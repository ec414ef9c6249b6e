// Several GPUs of one box as one node (kernels/cuda/nccl/, engine/device_group.h). Opening
// NCCL needs no device, so the first case runs on every machine with the headers; the others need
// two GPUs or more and skip, saying so, everywhere else. The reference for the group is one GPU
// training on the whole batch, as the CPU suite checks for CPU devices
// (tests/engine/test_device_group.cpp).
#ifdef STARLING_HAVE_NCCL

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cuda/nccl/nccl_all_reduce.h"
#include "kernels/cuda/nccl/nccl_library.h"
#include "engine/device_group.h"
#include "tests/gpu/cuda_skip.h"
#include "tests/support/compare.h"
#include "tests/support/model_configs.h"

using namespace starling;
using starling::test::normalized_error;
using starling::test::same_bits;

// Returns early from the test case, with a warning saying why, where fewer than two GPUs work.
#define STARLING_SKIP_WITHOUT_TWO_GPUS()                                     \
    do {                                                                     \
        std::string skip_reason_;                                            \
        const int gpus_ = starling::cuda::cuda_device_count(&skip_reason_);  \
        if (gpus_ < 2) {                                                     \
            WARN(gpus_ << " usable CUDA device(s), two needed"               \
                       << (gpus_ == 0 ? ": " + skip_reason_ : std::string()) \
                       << " (test case skipped)");                           \
            return;                                                          \
        }                                                                    \
    } while (0)

namespace {

std::vector<float> to_host(Ops<float>& ops, const float* device, size_t n) {
    std::vector<float> host(n);
    ops.to_host(host.data(), device, n);
    return host;
}

}  // namespace

TEST_CASE("NCCL opens at run time with every function a multi-GPU node calls", "[gpu][nccl]") {
    const cuda::NcclLibrary& lib = cuda::NcclLibrary::get();
    CHECK(lib.comm_init_all != nullptr);
    CHECK(lib.comm_destroy != nullptr);
    CHECK(lib.all_reduce != nullptr);
    CHECK(lib.group_start != nullptr);
    CHECK(lib.group_end != nullptr);
    CHECK(lib.last_error != nullptr);
    REQUIRE(lib.error_string != nullptr);
    CHECK(std::string(lib.error_string(ncclInvalidArgument)) ==
          "invalid argument (run with NCCL_DEBUG=WARN for details)");
    // The library found at run time is the major version the headers describe.
    CHECK(cuda::nccl_version().starts_with(std::to_string(NCCL_MAJOR) + "."));
    CHECK(&cuda::NcclLibrary::get() == &lib);
}

TEST_CASE("NCCL leaves the mean of one array per GPU in every array", "[gpu][nccl]") {
    STARLING_SKIP_WITHOUT_TWO_GPUS();
    const Backend backend = make_backend({"cuda:all", 0, "fp32"});
    REQUIRE(backend.all_reduce);
    const size_t count = backend.devices.size();
    const size_t n = 3 * 1024 * 1024 + 7;  // several NCCL chunks and an odd tail
    std::vector<std::vector<float>> host(count, std::vector<float>(n));
    std::vector<float*> arrays;
    std::mt19937 gen(1);
    std::uniform_real_distribution<float> value(-4.0f, 4.0f);
    for (size_t r = 0; r < count; r++) {
        for (float& x : host[r]) x = value(gen);
        arrays.push_back(backend.devices[r]->alloc(n));
        backend.devices[r]->from_host(arrays[r], host[r].data(), n);
    }
    backend.all_reduce->average(arrays, n);
    std::vector<double> want(n, 0.0);
    for (size_t r = 0; r < count; r++) {
        for (size_t i = 0; i < n; i++) want[i] += host[r][i] / static_cast<double>(count);
    }
    const std::vector<float> lead = to_host(*backend.devices[0], arrays[0], n);
    double worst = 0.0;
    for (size_t i = 0; i < n; i++) worst = std::max(worst, std::fabs(lead[i] - want[i]));
    // A sum of `count` values of at most 4 in fp32, in NCCL's order: a few ulp of 4 * count.
    CHECK(worst <= 4.0 * static_cast<double>(count) * 1e-6);
    for (size_t r = 1; r < count; r++) {
        CHECK(same_bits(to_host(*backend.devices[r], arrays[r], n), lead));
    }
    for (size_t r = 0; r < count; r++) backend.devices[r]->release(arrays[r]);
}

TEST_CASE("a group on every GPU steps as one GPU on the whole batch", "[gpu][nccl][model]") {
    STARLING_SKIP_WITHOUT_TWO_GPUS();
    const Backend every = make_backend({"cuda:all", 0, "fp32"});
    const Backend one = make_backend({"cuda:0", 0, "fp32"});
    const size_t count = every.devices.size();
    ModelConfig config = test::tiny_model_config();
    config.context = 32;
    const int B = 2 * static_cast<int>(count), T = 32;
    DeviceGroup group(every, config, AdamWConfig{}, B, T);
    DeviceGroup single(one, config, AdamWConfig{}, B, T);
    group.init_weights(4);
    single.init_weights(4);
    std::mt19937_64 gen(2);
    std::vector<int32_t> inputs(static_cast<size_t>(B) * T), targets(inputs.size());
    const size_t n = group.num_params();
    for (int step = 0; step < 5; step++) {
        CAPTURE(step);
        for (int32_t& t : inputs)
            t = static_cast<int32_t>(gen() % static_cast<uint64_t>(config.vocab_size));
        for (int32_t& t : targets)
            t = static_cast<int32_t>(gen() % static_cast<uint64_t>(config.vocab_size));
        const double want = single.train_step(inputs.data(), targets.data(), 1e-2f).loss;
        const double got = group.train_step(inputs.data(), targets.data(), 1e-2f).loss;
        CHECK(std::fabs(got - want) <= 1e-5 * want);
        const std::vector<float> lead = to_host(*every.devices[0], group.lead().params(), n);
        CHECK(normalized_error(lead, to_host(*one.devices[0], single.lead().params(), n)) < 1e-4);
        for (size_t r = 1; r < count; r++) {
            CHECK(same_bits(to_host(*every.devices[r], group.model(r).params(), n), lead));
        }
    }
}

#endif  // STARLING_HAVE_NCCL
