#include <catch2/catch.hpp>

#include <cmath>

#include "kernels/cpu/cpu_ops.h"
#include "tests/support/fd_check.h"
#include "tests/support/random.h"

using namespace starling;
using namespace starling::test;

TEMPLATE_TEST_CASE("swiglu_forward matches silu(gate) * up", "[swiglu]", float, double) {
    using T = TestType;
    CpuOps<T> ops;
    const int N = 5, F = 6;
    auto gu = random_vector<T>(size_t(N) * 2 * F, 51, -4.0, 4.0);
    std::vector<double> ref(size_t(N) * F);
    for (int n = 0; n < N; n++) {
        for (int i = 0; i < F; i++) {
            double gate = double(gu[n * 2 * F + i]);
            double up = double(gu[n * 2 * F + F + i]);
            ref[n * F + i] = gate / (1.0 + std::exp(-gate)) * up;
        }
    }
    std::vector<T> out(ref.size());
    ops.swiglu_forward(out.data(), gu.data(), N, F);
    REQUIRE(max_rel_diff(out, ref) < forward_tol<T>());
}

TEST_CASE("swiglu_backward matches finite differences", "[swiglu][grad]") {
    CpuOps<double> ops;
    const int N = 5, F = 6;
    auto gu = random_vector<double>(size_t(N) * 2 * F, 52, -4.0, 4.0);
    auto R = random_vector<double>(size_t(N) * F, 53);
    auto loss = [&] {
        std::vector<double> out(R.size());
        ops.swiglu_forward(out.data(), gu.data(), N, F);
        return weighted_sum(out, R);
    };
    // Junk in dgu checks that both halves are overwritten.
    auto dgu = random_vector<double>(gu.size(), 54, 5.0, 6.0);
    ops.swiglu_backward(dgu.data(), R.data(), gu.data(), N, F);
    REQUIRE(fd_max_rel_error(loss, gu.data(), dgu.data(), gu.size()) < kGradTol);
}
