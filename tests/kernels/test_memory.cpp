#include <catch2/catch.hpp>

#include <omp.h>

#include <cstdint>
#include <vector>

#include "kernels/cpu/cpu_ops.h"

using namespace starling;

TEST_CASE("alloc gives aligned, zeroed memory and transfers round-trip", "[memory]") {
    CpuOps<float> ops;
    const size_t n = 1000;
    float* a = ops.alloc(n);
    float* b = ops.alloc(n);
    REQUIRE(reinterpret_cast<uintptr_t>(a) % 64 == 0);
    for (size_t i = 0; i < n; i++) {
        REQUIRE(a[i] == 0.0f);
    }
    std::vector<float> host(n), back(n);
    for (size_t i = 0; i < n; i++) {
        host[i] = float(i) * 0.5f + 1.0f;
    }
    ops.from_host(a, host.data(), n);
    ops.copy(b, a, n);
    ops.to_host(back.data(), b, n);
    REQUIRE(back == host);
    ops.fill_zero(b, n);
    ops.to_host(back.data(), b, n);
    REQUIRE(back == std::vector<float>(n, 0.0f));

    int32_t* tokens = ops.alloc_tokens(3);
    REQUIRE(reinterpret_cast<uintptr_t>(tokens) % 64 == 0);
    REQUIRE(tokens[2] == 0);
    const int32_t host_tokens[3] = {5, -1, 7};
    ops.tokens_from_host(tokens, host_tokens, 3);
    REQUIRE(tokens[1] == -1);

    ops.release(a);
    ops.release(b);
    ops.release(tokens);
    ops.release(ops.alloc(0));
}

TEST_CASE("set_cpu_threads sets the kernel thread count", "[threads]") {
    int previous = cpu_threads();
    set_cpu_threads(1);
    REQUIRE(cpu_threads() == 1);
    set_cpu_threads(2);
    REQUIRE(cpu_threads() == 2);
    set_cpu_threads(0);
    REQUIRE(cpu_threads() == omp_get_num_procs());
    set_cpu_threads(previous);
}
