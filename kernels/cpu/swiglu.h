// SwiGLU activation on the fused gate/up projection: one (N,2F) matmul output instead of two.
#pragma once

#include <cstddef>

#include "kernels/math.h"

namespace starling::cpu {

// out (N,F) from gu (N,2F) = [gate | up]
template <typename T>
void swiglu_forward(T* out, const T* gu, int N, int F) {
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const T* gate = gu + size_t(n) * 2 * F;
        const T* up = gate + F;
        T* y = out + size_t(n) * F;
        for (int i = 0; i < F; i++) {
            y[i] = silu(gate[i]) * up[i];
        }
    }
}

// dgu (N,2F) overwritten, from dout (N,F), gu (N,2F)
template <typename T>
void swiglu_backward(T* dgu, const T* dout, const T* gu, int N, int F) {
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const T* gate = gu + size_t(n) * 2 * F;
        const T* up = gate + F;
        const T* g = dout + size_t(n) * F;
        T* dgate = dgu + size_t(n) * 2 * F;
        T* dup = dgate + F;
        for (int i = 0; i < F; i++) {
            dgate[i] = g[i] * up[i] * silu_grad(gate[i]);
            dup[i] = g[i] * silu(gate[i]);
        }
    }
}

}  // namespace starling::cpu
