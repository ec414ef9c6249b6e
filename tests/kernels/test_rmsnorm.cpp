#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>

#include "kernels/cpu/cpu_ops.h"
#include "tests/support/fd_check.h"
#include "tests/support/determinism.h"
#include "tests/support/random.h"

using namespace starling;
using namespace starling::test;

namespace {
constexpr float kEps = 1e-5f;
}

TEMPLATE_TEST_CASE("rmsnorm_forward matches the formula", "[rmsnorm]", float, double) {
    using T = TestType;
    CpuOps<T> ops;
    // C = 45 is not a multiple of any vector width or column block.
    for (auto [rows, cols] : {std::pair{6, 10}, std::pair{1, 45}}) {
        const int N = rows, C = cols;
        INFO("N " << N << " C " << C);
        auto inp = random_vector<T>(size_t(N) * C, 11, -2.0, 2.0);
        auto weight = random_vector<T>(size_t(C), 12, 0.5, 1.5);
        std::vector<double> ref(inp.size()), ref_rstd(N);
        for (int n = 0; n < N; n++) {
            double ss = 0.0;
            for (int c = 0; c < C; c++) {
                ss += double(inp[n * C + c]) * double(inp[n * C + c]);
            }
            ref_rstd[n] = 1.0 / std::sqrt(ss / C + double(kEps));
            for (int c = 0; c < C; c++) {
                ref[n * C + c] = double(inp[n * C + c]) * ref_rstd[n] * double(weight[c]);
            }
        }
        std::vector<T> out(inp.size()), rstd(N);
        ops.rmsnorm_forward(out.data(), rstd.data(), inp.data(), weight.data(), N, C, kEps);
        REQUIRE(max_rel_diff(out, ref) < forward_tol<T>());
        REQUIRE(max_rel_diff(rstd, ref_rstd) < forward_tol<T>());
    }
}

TEST_CASE("rmsnorm_backward matches finite differences and accumulates", "[rmsnorm][grad]") {
    CpuOps<double> ops;
    for (auto [rows, cols] : {std::pair{6, 8}, std::pair{1, 8}, std::pair{5, 45}}) {
        const int N = rows, C = cols;
        INFO("N " << N << " C " << C);
        auto inp = random_vector<double>(size_t(N) * C, 13, -2.0, 2.0);
        auto weight = random_vector<double>(size_t(C), 14, 0.5, 1.5);
        auto R = random_vector<double>(inp.size(), 15);
        std::vector<double> out(inp.size()), rstd(N);
        auto loss = [&] {
            ops.rmsnorm_forward(out.data(), rstd.data(), inp.data(), weight.data(), N, C, kEps);
            return weighted_sum(out, R);
        };
        loss();
        // Both gradients must be added to what is already there (dinp is the residual stream).
        auto dinp0 = random_vector<double>(inp.size(), 16);
        auto dweight0 = random_vector<double>(weight.size(), 17);
        auto dinp = dinp0;
        auto dweight = dweight0;
        ops.rmsnorm_backward(dinp.data(), dweight.data(), R.data(), inp.data(), weight.data(),
                             rstd.data(), N, C);
        auto grad_inp = minus(dinp, dinp0);
        auto grad_weight = minus(dweight, dweight0);
        REQUIRE(fd_max_rel_error(loss, inp.data(), grad_inp.data(), inp.size()) < kGradTol);
        REQUIRE(fd_max_rel_error(loss, weight.data(), grad_weight.data(), weight.size()) <
                kGradTol);
    }
}

TEST_CASE("rmsnorm_backward is bit-reproducible and independent of the thread count",
          "[rmsnorm][determinism]") {
    CpuOps<float> ops;
    const int N = 300, C = 200;
    auto inp = random_vector<float>(size_t(N) * C, 18);
    auto weight = random_vector<float>(size_t(C), 19);
    auto dout = random_vector<float>(inp.size(), 20);
    auto dinp0 = random_vector<float>(inp.size(), 21);
    auto dweight0 = random_vector<float>(weight.size(), 22);
    std::vector<float> out(inp.size()), rstd(N);
    ops.rmsnorm_forward(out.data(), rstd.data(), inp.data(), weight.data(), N, C, kEps);
    require_same_bits_for_any_thread_count([&] {
        auto dinp = dinp0;
        auto dweight = dweight0;
        ops.rmsnorm_backward(dinp.data(), dweight.data(), dout.data(), inp.data(), weight.data(),
                             rstd.data(), N, C);
        dinp.insert(dinp.end(), dweight.begin(), dweight.end());
        return dinp;
    });
}
