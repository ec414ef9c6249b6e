#include <catch2/catch.hpp>

#include <cmath>

#include "kernels/cpu/cpu_ops.h"
#include "common/error.h"
#include "tests/support/fd_check.h"
#include "tests/support/random.h"

using namespace starling;
using namespace starling::test;

namespace {

constexpr int kN = 6, kV = 11;
const std::vector<int32_t> kTargets = {0, 10, 3, 3, 7, 1};

// log(sum(exp(x))) - x[target], with no max subtraction: fine for logits of order one.
template <typename T>
std::vector<double> crossentropy_reference(const std::vector<T>& logits) {
    std::vector<double> ref(kN);
    for (int n = 0; n < kN; n++) {
        double z = 0.0;
        for (int j = 0; j < kV; j++) {
            z += std::exp(double(logits[n * kV + j]));
        }
        ref[n] = std::log(z) - double(logits[n * kV + kTargets[n]]);
    }
    return ref;
}

}  // namespace

TEMPLATE_TEST_CASE("crossentropy_forward matches a naive log-sum-exp", "[crossentropy]", float,
                   double) {
    using T = TestType;
    CpuOps<T> ops;
    auto logits = random_vector<T>(size_t(kN) * kV, 71, -3.0, 3.0);
    std::vector<T> losses(kN);
    ops.crossentropy_forward(losses.data(), logits.data(), kTargets.data(), kN, kV);
    REQUIRE(max_rel_diff(losses, crossentropy_reference(logits)) < forward_tol<T>());
}

TEST_CASE("crossentropy_forward is stable for large logits", "[crossentropy]") {
    // exp(1000) overflows, but the loss does not change when every logit moves by the same amount.
    CpuOps<double> ops;
    auto logits = random_vector<double>(size_t(kN) * kV, 72, -3.0, 3.0);
    auto shifted = logits;
    for (double& x : shifted) {
        x += 1000.0;
    }
    std::vector<double> losses(kN);
    ops.crossentropy_forward(losses.data(), shifted.data(), kTargets.data(), kN, kV);
    REQUIRE(max_rel_diff(losses, crossentropy_reference(logits)) < 1e-10);
}

TEST_CASE("crossentropy_backward matches finite differences, also in place",
          "[crossentropy][grad]") {
    CpuOps<double> ops;
    const float dloss = 0.37f;
    auto logits = random_vector<double>(size_t(kN) * kV, 73, -3.0, 3.0);
    auto loss = [&] {
        std::vector<double> losses(kN);
        ops.crossentropy_forward(losses.data(), logits.data(), kTargets.data(), kN, kV);
        double total = 0.0;
        for (double l : losses) {
            total += l;
        }
        return total * double(dloss);
    };
    std::vector<double> dlogits(logits.size());
    ops.crossentropy_backward(dlogits.data(), logits.data(), kTargets.data(), dloss, kN, kV);
    REQUIRE(fd_max_rel_error(loss, logits.data(), dlogits.data(), logits.size()) < kGradTol);

    auto in_place = logits;
    ops.crossentropy_backward(in_place.data(), in_place.data(), kTargets.data(), dloss, kN, kV);
    REQUIRE(in_place == dlogits);
}

TEST_CASE("crossentropy_forward rejects a target outside the vocabulary", "[crossentropy]") {
    CpuOps<float> ops;
    auto logits = random_vector<float>(size_t(2) * kV, 74);
    std::vector<float> losses(2);
    for (int32_t bad : {kV, -1}) {
        std::vector<int32_t> targets = {2, bad};
        REQUIRE_THROWS_AS(
            ops.crossentropy_forward(losses.data(), logits.data(), targets.data(), 2, kV), Error);
        REQUIRE_THROWS_WITH(
            ops.crossentropy_forward(losses.data(), logits.data(), targets.data(), 2, kV),
            Catch::Contains("target " + std::to_string(bad)));
    }
}
