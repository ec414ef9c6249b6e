#include <catch2/catch.hpp>

#include <cmath>

#include "kernels/cpu/cpu_ops.h"
#include "tests/support/random.h"

using namespace starling;
using namespace starling::test;

TEMPLATE_TEST_CASE("sum and sum_squares match a serial double loop", "[reduce]", float, double) {
    using T = TestType;
    CpuOps<T> ops;
    // 0, one element, and a length that is not a multiple of any block.
    for (size_t n : {size_t(0), size_t(1), size_t(100003)}) {
        INFO("n " << n);
        auto x = random_vector<T>(n, 81, -1.0, 2.0);
        double ref_sum = 0.0, ref_squares = 0.0, magnitude = 0.0;
        for (T e : x) {
            ref_sum += double(e);
            ref_squares += double(e) * double(e);
            magnitude += std::abs(double(e));
        }
        // Both sides add exact double values, so only the summation order differs.
        REQUIRE(std::abs(ops.sum(x.data(), n) - ref_sum) <= 1e-12 * magnitude);
        REQUIRE(std::abs(ops.sum_squares(x.data(), n) - ref_squares) <= 1e-12 * ref_squares);
    }
}

TEST_CASE("sum is independent of the thread count", "[reduce][determinism]") {
    CpuOps<float> ops;
    auto x = random_vector<float>(200001, 82);
    int previous = cpu_threads();
    set_cpu_threads(2);
    double two = ops.sum(x.data(), x.size());
    double two_squares = ops.sum_squares(x.data(), x.size());
    set_cpu_threads(1);
    double one = ops.sum(x.data(), x.size());
    double one_squares = ops.sum_squares(x.data(), x.size());
    set_cpu_threads(previous);
    REQUIRE(two == one);
    REQUIRE(two_squares == one_squares);
}

TEMPLATE_TEST_CASE("scale multiplies every element", "[reduce]", float, double) {
    using T = TestType;
    CpuOps<T> ops;
    auto x = random_vector<T>(1001, 83);
    auto scaled = x;
    ops.scale(scaled.data(), 0.3f, scaled.size());
    for (size_t i = 0; i < x.size(); i++) {
        REQUIRE(scaled[i] == x[i] * T(0.3f));
    }
}
