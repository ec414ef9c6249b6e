// Token embedding lookup and its scatter-add gradient.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>

#include "common/error.h"

namespace starling::cpu {

// out (N,C) from tokens (N), wte (V,C)
template <typename T>
void embedding_forward(T* out, const int32_t* tokens, const T* wte, int N, int C) {
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        std::copy_n(wte + size_t(tokens[n]) * C, C, out + size_t(n) * C);
    }
}

// dwte (V,C) += scatter of dout (N,C) by tokens (N)
template <typename T>
void embedding_backward(T* dwte, const T* dout, const int32_t* tokens, int N, int C, int V) {
    // A bad token would write outside dwte; the check is N reads against N*C of work.
    for (int n = 0; n < N; n++) {
        if (tokens[n] < 0 || tokens[n] >= V) {
            throw Error("embedding_backward: token " + std::to_string(tokens[n]) + " at row " +
                        std::to_string(n) + " is outside the vocabulary [0, " + std::to_string(V) +
                        ")");
        }
    }
    // Repeated tokens make rows collide, so threads split the channels instead of the rows:
    // each thread adds every row into its own slice, in row order, with no atomics, and the
    // result is the same for any thread count.
    constexpr int kSlice = 64;
    int slices = (C + kSlice - 1) / kSlice;
#pragma omp parallel for schedule(static)
    for (int s = 0; s < slices; s++) {
        int c0 = s * kSlice;
        int width = std::min(kSlice, C - c0);
        for (int n = 0; n < N; n++) {
            T* dst = dwte + size_t(tokens[n]) * C + c0;
            const T* src = dout + size_t(n) * C + c0;
#pragma omp simd
            for (int c = 0; c < width; c++) {
                dst[c] += src[c];
            }
        }
    }
}

}  // namespace starling::cpu
