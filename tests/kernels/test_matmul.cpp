#include <catch2/catch.hpp>

#include "kernels/cpu/cpu_ops.h"
#include "tests/support/fd_check.h"
#include "tests/support/random.h"

using namespace starling;
using namespace starling::test;

TEMPLATE_TEST_CASE("matmul_forward matches a triple loop", "[matmul]", float, double) {
    using T = TestType;
    CpuOps<T> ops;
    const int N = 7, IC = 13, OC = 5;
    auto inp = random_vector<T>(size_t(N) * IC, 1);
    auto weight = random_vector<T>(size_t(OC) * IC, 2);
    auto old_out = random_vector<T>(size_t(N) * OC, 3);
    for (bool accumulate : {false, true}) {
        INFO("accumulate " << accumulate);
        std::vector<double> ref(size_t(N) * OC);
        for (int n = 0; n < N; n++) {
            for (int o = 0; o < OC; o++) {
                double s = accumulate ? double(old_out[n * OC + o]) : 0.0;
                for (int i = 0; i < IC; i++) {
                    s += double(inp[n * IC + i]) * double(weight[o * IC + i]);
                }
                ref[n * OC + o] = s;
            }
        }
        auto out = old_out;
        ops.matmul_forward(out.data(), inp.data(), weight.data(), N, IC, OC, accumulate);
        REQUIRE(max_rel_diff(out, ref) < forward_tol<T>());
    }
}

TEST_CASE("matmul_backward matches finite differences", "[matmul][grad]") {
    CpuOps<double> ops;
    const int N = 6, IC = 7, OC = 5;
    auto inp = random_vector<double>(size_t(N) * IC, 4);
    auto weight = random_vector<double>(size_t(OC) * IC, 5);
    auto R = random_vector<double>(size_t(N) * OC, 6);
    auto loss = [&] {
        std::vector<double> out(size_t(N) * OC);
        ops.matmul_forward(out.data(), inp.data(), weight.data(), N, IC, OC, false);
        return weighted_sum(out, R);
    };
    // Non-zero starting gradients check that dinp is overwritten or added to as asked, and that
    // dweight is always added to.
    auto dinp0 = random_vector<double>(inp.size(), 7);
    auto dweight0 = random_vector<double>(weight.size(), 8);

    for (bool accumulate_dinp : {false, true}) {
        INFO("accumulate_dinp " << accumulate_dinp);
        auto dinp = dinp0;
        auto dweight = dweight0;
        ops.matmul_backward(dinp.data(), dweight.data(), R.data(), inp.data(), weight.data(), N, IC,
                            OC, accumulate_dinp);
        auto grad_inp = accumulate_dinp ? minus(dinp, dinp0) : dinp;
        auto grad_weight = minus(dweight, dweight0);
        REQUIRE(fd_max_rel_error(loss, inp.data(), grad_inp.data(), inp.size()) < kGradTol);
        REQUIRE(fd_max_rel_error(loss, weight.data(), grad_weight.data(), weight.size()) <
                kGradTol);
    }

    SECTION("without dinp, dweight still accumulates") {
        auto dweight = dweight0;
        ops.matmul_backward(nullptr, dweight.data(), R.data(), inp.data(), weight.data(), N, IC, OC,
                            false);
        auto grad_weight = minus(dweight, dweight0);
        REQUIRE(fd_max_rel_error(loss, weight.data(), grad_weight.data(), weight.size()) <
                kGradTol);
    }
}
