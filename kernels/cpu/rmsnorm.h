// RMSNorm. Row statistics are accumulated in double in both precisions so float and double runs
// differ only by the storage rounding, which keeps the float-vs-double tests tight.
#pragma once

#include <algorithm>
#include <cstddef>

#include "kernels/math.h"

namespace starling::cpu {

// out (N,C), rstd (N) from inp (N,C), weight (C)
template <typename T>
void rmsnorm_forward(T* out, T* rstd, const T* inp, const T* weight, int N, int C, float eps) {
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const T* x = inp + size_t(n) * C;
        T* y = out + size_t(n) * C;
        double ss = 0.0;
#pragma omp simd reduction(+ : ss)
        for (int c = 0; c < C; c++) {
            ss += double(x[c]) * double(x[c]);
        }
        T r = T(rmsnorm_rstd(ss, C, eps));
        rstd[n] = r;
#pragma omp simd
        for (int c = 0; c < C; c++) {
            y[c] = x[c] * r * weight[c];
        }
    }
}

// dinp (N,C) +=, dweight (C) += from dout (N,C), inp (N,C), weight (C), rstd (N)
template <typename T>
void rmsnorm_backward(T* dinp, T* dweight, const T* dout, const T* inp, const T* weight,
                      const T* rstd, int N, int C) {
    // d/dx_k = r w_k g_k - x_k r^3 / C * sum_i g_i w_i x_i, since dr/dx_k = -r^3 x_k / C.
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const T* x = inp + size_t(n) * C;
        const T* g = dout + size_t(n) * C;
        T* dx = dinp + size_t(n) * C;
        double dot = 0.0;
#pragma omp simd reduction(+ : dot)
        for (int c = 0; c < C; c++) {
            dot += double(g[c]) * double(weight[c]) * double(x[c]);
        }
        T r = rstd[n];
        T coef = T(dot * double(r) * double(r) * double(r) / C);
#pragma omp simd
        for (int c = 0; c < C; c++) {
            dx[c] += r * weight[c] * g[c] - coef * x[c];
        }
    }

    // dweight sums over rows; splitting by column blocks gives each thread whole sums, so the
    // result is bit-identical for any thread count and needs no atomics.
    constexpr int kBlock = 32;
    int blocks = (C + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static)
    for (int blk = 0; blk < blocks; blk++) {
        int c0 = blk * kBlock;
        int width = std::min(kBlock, C - c0);
        double acc[kBlock] = {};
        for (int n = 0; n < N; n++) {
            const T* x = inp + size_t(n) * C + c0;
            const T* g = dout + size_t(n) * C + c0;
            double r = double(rstd[n]);
#pragma omp simd
            for (int c = 0; c < width; c++) {
                acc[c] += double(g[c]) * double(x[c]) * r;
            }
        }
        for (int c = 0; c < width; c++) {
            dweight[c0 + c] += T(acc[c]);
        }
    }
}

}  // namespace starling::cpu
