// Per-element math shared by the CPU and CUDA backends: written once, so the CPU tests check the
// same arithmetic the GPU runs. Everything here is inline, header-only and __host__ __device__.
// The random numbers and the codecs' rounding, which layers below the kernels use too, are in
// common/random.h and common/stochastic_rounding.h.
#pragma once

#include <cmath>
#include <cstdint>

#include "common/host_device.h"

namespace starling {

// SiLU and its derivative: silu(x) = x * sigmoid(x).
template <typename T>
STARLING_HD T silu(T x) {
    return x / (T(1) + std::exp(-x));
}

template <typename T>
STARLING_HD T silu_grad(T x) {
    T s = T(1) / (T(1) + std::exp(-x));
    return s * (T(1) + x * (T(1) - s));
}

// Rotary embedding frequency for pair i of a head of size hs (Hugging Face Llama convention:
// element j is paired with element j + hs/2).
STARLING_HD double rope_inv_freq(int i, int hs, double theta) {
    return std::pow(theta, -2.0 * i / hs);
}

// RMSNorm's reciprocal root mean square of a row of C elements, from its sum of squares.
template <typename A>
STARLING_HD A rmsnorm_rstd(A sum_squares, int C, float eps) {
    return A(1) / std::sqrt(sum_squares / A(C) + A(eps));
}

// Rotates one RoPE pair (x0 = element j, x1 = element j + hs/2) by the angle with cosine c and
// sine s; the inverse rotation is the same call with -s.
template <typename T>
STARLING_HD void rope_rotate(T& x0, T& x1, T c, T s) {
    T r0 = x0 * c - x1 * s;
    T r1 = x1 * c + x0 * s;
    x0 = r0;
    x1 = r1;
}

// One AdamW element update with decoupled weight decay; bias corrections precomputed by the caller.
struct AdamWScalars {
    float lr;
    float beta1;
    float beta2;
    float eps;
    float weight_decay;
    float bias_correction1;  // 1 - beta1^t
    float bias_correction2;  // 1 - beta2^t
    float grad_scale;        // clipping factor applied to every gradient
};

template <typename T>
STARLING_HD void adamw_element(T& param, T& m, T& v, T grad, const AdamWScalars& s) {
    grad *= T(s.grad_scale);
    m = T(s.beta1) * m + (T(1) - T(s.beta1)) * grad;
    v = T(s.beta2) * v + (T(1) - T(s.beta2)) * grad * grad;
    T m_hat = m / T(s.bias_correction1);
    T v_hat = v / T(s.bias_correction2);
    param -= T(s.lr) * (m_hat / (std::sqrt(v_hat) + T(s.eps)) + T(s.weight_decay) * param);
}

// One element of an outer step (optimizer/outer.h), in the project's one sign convention: the
// update signal g (already scaled by the outer lr, pointing from phi towards where the round went)
// feeds the outer momentum delta, and phi moves by delta (heavy-ball) or by g + momentum * delta
// (Nesterov's look-ahead).
STARLING_HD void outer_element(float& phi, float& delta, float g, float momentum, bool nesterov) {
    delta = momentum * delta + g;
    phi += nesterov ? g + momentum * delta : delta;
}

}  // namespace starling
