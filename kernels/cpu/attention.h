// Causal multi-head attention without a stored (B,NH,T,T) tensor: each (batch, head) pair is one
// task with a private (T,T) scratch; the forward keeps only the row log-sum-exp, from which the
// backward recomputes the probabilities. Heads are addressed in place inside qkv through the
// leading dimension 3C, so q, k and v are never permuted. OpenBLAS called inside the OpenMP
// region runs single-threaded, so the parallelism is across (b, h), and since every task writes
// its own column blocks of the output, no reduction crosses threads.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <vector>

#include "kernels/cpu/matmul.h"

namespace starling::cpu {

// out (B,T,C), lse (B,NH,T) from qkv (B,T,3C)
template <typename T>
void attention_forward(T* out, T* lse, const T* qkv, int B, int T_, int C, int NH) {
    int hs = C / NH;
    int C3 = 3 * C;
    T scale = T(1.0 / std::sqrt(double(hs)));
#pragma omp parallel
    {
        std::vector<T> P(size_t(T_) * T_);
#pragma omp for schedule(static)
        for (int bh = 0; bh < B * NH; bh++) {
            int b = bh / NH;
            int h = bh % NH;
            const T* q = qkv + size_t(b) * T_ * C3 + size_t(h) * hs;
            const T* k = q + C;
            const T* v = q + 2 * C;
            T* lse_bh = lse + size_t(bh) * T_;
            gemm(CblasNoTrans, CblasTrans, T_, T_, hs, scale, q, C3, k, C3, T(0), P.data(), T_);
            for (int i = 0; i < T_; i++) {
                T* p = P.data() + size_t(i) * T_;
                T mx = p[0];
#pragma omp simd reduction(max : mx)
                for (int j = 1; j <= i; j++) {
                    mx = std::max(mx, p[j]);
                }
                double sum = 0.0;
                for (int j = 0; j <= i; j++) {
                    p[j] = std::exp(p[j] - mx);
                    sum += double(p[j]);
                }
                T inv = T(1.0 / sum);
#pragma omp simd
                for (int j = 0; j <= i; j++) {
                    p[j] *= inv;
                }
                // Zeros above the diagonal let the P @ V gemm run over full rows.
                std::fill(p + i + 1, p + T_, T(0));
                lse_bh[i] = T(double(mx) + std::log(sum));
            }
            gemm(CblasNoTrans, CblasNoTrans, T_, hs, T_, T(1), P.data(), T_, v, C3, T(0),
                 out + size_t(b) * T_ * C + size_t(h) * hs, C);
        }
    }
}

// dqkv (B,T,3C) overwritten, from dout (B,T,C), qkv (B,T,3C), out (B,T,C), lse (B,NH,T)
template <typename T>
void attention_backward(T* dqkv, const T* dout, const T* qkv, const T* out, const T* lse, int B,
                        int T_, int C, int NH) {
    int hs = C / NH;
    int C3 = 3 * C;
    T scale = T(1.0 / std::sqrt(double(hs)));
#pragma omp parallel
    {
        std::vector<T> P(size_t(T_) * T_);
        std::vector<T> dS(size_t(T_) * T_);
#pragma omp for schedule(static)
        for (int bh = 0; bh < B * NH; bh++) {
            int b = bh / NH;
            int h = bh % NH;
            size_t qkv_off = size_t(b) * T_ * C3 + size_t(h) * hs;
            size_t out_off = size_t(b) * T_ * C + size_t(h) * hs;
            const T* q = qkv + qkv_off;
            const T* k = q + C;
            const T* v = q + 2 * C;
            const T* o = out + out_off;
            const T* dO = dout + out_off;
            T* dq = dqkv + qkv_off;
            T* dk = dq + C;
            T* dv = dq + 2 * C;
            const T* lse_bh = lse + size_t(bh) * T_;

            gemm(CblasNoTrans, CblasTrans, T_, T_, hs, scale, q, C3, k, C3, T(0), P.data(), T_);
            for (int i = 0; i < T_; i++) {
                T* p = P.data() + size_t(i) * T_;
                for (int j = 0; j <= i; j++) {
                    p[j] = std::exp(p[j] - lse_bh[i]);
                }
                std::fill(p + i + 1, p + T_, T(0));
            }

            gemm(CblasNoTrans, CblasTrans, T_, T_, hs, T(1), dO, C, v, C3, T(0), dS.data(), T_);
            for (int i = 0; i < T_; i++) {
                // sum_j P_ij dP_ij equals dO_i . O_i, which costs hs instead of T.
                const T* o_i = o + size_t(i) * C;
                const T* dO_i = dO + size_t(i) * C;
                double D = 0.0;
#pragma omp simd reduction(+ : D)
                for (int d = 0; d < hs; d++) {
                    D += double(dO_i[d]) * double(o_i[d]);
                }
                const T* p = P.data() + size_t(i) * T_;
                T* ds = dS.data() + size_t(i) * T_;
                T Di = T(D);
                // Masked entries have P = 0, so they come out 0 without a branch.
#pragma omp simd
                for (int j = 0; j < T_; j++) {
                    ds[j] = p[j] * (ds[j] - Di) * scale;
                }
            }

            gemm(CblasNoTrans, CblasNoTrans, T_, hs, T_, T(1), dS.data(), T_, k, C3, T(0), dq, C3);
            gemm(CblasTrans, CblasNoTrans, T_, hs, T_, T(1), dS.data(), T_, q, C3, T(0), dk, C3);
            gemm(CblasTrans, CblasNoTrans, T_, hs, T_, T(1), P.data(), T_, dO, C, T(0), dv, C3);
        }
    }
}

}  // namespace starling::cpu
