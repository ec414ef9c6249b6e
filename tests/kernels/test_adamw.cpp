#include <catch2/catch.hpp>

#include <cmath>

#include "kernels/cpu/cpu_ops.h"

using namespace starling;

// Hyperparameters that are exact in float, so the hand arithmetic in double below sees the same
// numbers as the kernel does after AdamWScalars stores them as float.
TEMPLATE_TEST_CASE("adamw_update matches two steps worked by hand", "[adamw]", float, double) {
    using T = TestType;
    CpuOps<T> ops;
    const double lr = 0.125, beta1 = 0.875, beta2 = 0.984375, eps = 0x1.0p-20, wd = 0.0625;
    const double grad_scale = 0.5;

    // Three elements: an ordinary one, one with a steady negative gradient, and one with no
    // gradient at all, which only the decoupled weight decay moves.
    std::vector<T> params = {T(1.0), T(-0.5), T(2.0)};
    std::vector<T> m(3), v(3);
    const double g1[3] = {0.4, -1.0, 0.0};
    const double g2[3] = {-0.2, -1.0, 0.0};

    // Step 1: bias corrections 1 - 0.875 = 0.125 and 1 - 0.984375 = 0.015625.
    AdamWScalars s1{float(lr), float(beta1), float(beta2), float(eps),
                    float(wd), 0.125f,       0.015625f,    float(grad_scale)};
    std::vector<T> grads1 = {T(g1[0]), T(g1[1]), T(g1[2])};
    ops.adamw_update(params.data(), m.data(), v.data(), grads1.data(), 3, s1);

    // Step 2: 1 - 0.875^2 = 0.234375 and 1 - 0.984375^2 = 0.031005859375.
    AdamWScalars s2 = s1;
    s2.bias_correction1 = 0.234375f;
    s2.bias_correction2 = 0.031005859375f;
    std::vector<T> grads2 = {T(g2[0]), T(g2[1]), T(g2[2])};
    ops.adamw_update(params.data(), m.data(), v.data(), grads2.data(), 3, s2);

    const double p0[3] = {1.0, -0.5, 2.0};
    const double tol = std::is_same_v<T, double> ? 1e-13 : 1e-6;
    for (int i = 0; i < 3; i++) {
        INFO("element " << i);
        double g = g1[i] * grad_scale;
        double m1 = (1 - beta1) * g;
        double v1 = (1 - beta2) * g * g;
        double p1 = p0[i] - lr * ((m1 / 0.125) / (std::sqrt(v1 / 0.015625) + eps) + wd * p0[i]);

        g = g2[i] * grad_scale;
        double m2 = beta1 * m1 + (1 - beta1) * g;
        double v2 = beta2 * v1 + (1 - beta2) * g * g;
        double p2 = p1 - lr * ((m2 / 0.234375) / (std::sqrt(v2 / 0.031005859375) + eps) + wd * p1);

        REQUIRE(std::abs(double(m[i]) - m2) <= tol);
        REQUIRE(std::abs(double(v[i]) - v2) <= tol);
        REQUIRE(std::abs(double(params[i]) - p2) <= tol);
    }
    // The gradient-free element decays geometrically: p * (1 - lr * wd)^2.
    REQUIRE(std::abs(double(params[2]) - 2.0 * (1 - lr * wd) * (1 - lr * wd)) <= tol);
}
