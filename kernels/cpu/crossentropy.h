// Cross-entropy over the vocabulary, with the max subtracted before exponentiating so large
// logits cannot overflow.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>

#include "common/error.h"

namespace starling::cpu {

// Largest element of a row of V.
template <typename T>
T row_max(const T* x, int V) {
    T mx = x[0];
#pragma omp simd reduction(max : mx)
    for (int j = 1; j < V; j++) {
        mx = std::max(mx, x[j]);
    }
    return mx;
}

// losses (N) from logits (N,V), targets (N)
template <typename T>
void crossentropy_forward(T* losses, const T* logits, const int32_t* targets, int N, int V) {
    // Checked before the parallel loop because an exception must not leave an OpenMP region.
    for (int n = 0; n < N; n++) {
        if (targets[n] < 0 || targets[n] >= V) {
            throw Error("crossentropy_forward: target " + std::to_string(targets[n]) + " at row " +
                        std::to_string(n) + " is outside the vocabulary [0, " + std::to_string(V) +
                        ")");
        }
    }
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const T* x = logits + size_t(n) * V;
        T mx = row_max(x, V);
        double sum = 0.0;
        for (int j = 0; j < V; j++) {
            sum += double(std::exp(x[j] - mx));
        }
        losses[n] = T(std::log(sum) + double(mx) - double(x[targets[n]]));
    }
}

// dlogits (N,V) from logits (N,V), targets (N); dlogits may alias logits
template <typename T>
void crossentropy_backward(T* dlogits, const T* logits, const int32_t* targets, float dloss, int N,
                           int V) {
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const T* x = logits + size_t(n) * V;
        T* dx = dlogits + size_t(n) * V;
        T mx = row_max(x, V);
        // The exponentials are parked in dx so each is computed once; every x[j] is read before
        // dx[j] is written, which is what makes the in-place call safe.
        double sum = 0.0;
        for (int j = 0; j < V; j++) {
            T e = std::exp(x[j] - mx);
            dx[j] = e;
            sum += double(e);
        }
        T factor = T(double(dloss) / sum);
#pragma omp simd
        for (int j = 0; j < V; j++) {
            dx[j] *= factor;
        }
        dx[targets[n]] -= T(dloss);
    }
}

}  // namespace starling::cpu
