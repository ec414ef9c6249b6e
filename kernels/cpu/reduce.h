// Whole-arena reductions (loss sums, gradient norms) and scaling.
#pragma once

#include <algorithm>
#include <cstddef>
#include <vector>

namespace starling::cpu {

// Sum over x (n) of f(x_i), in double. The array is cut into fixed blocks whose partial sums are
// added in block order, so the result is bit-identical for any thread count, which an OpenMP
// reduction clause does not promise.
template <typename T, typename F>
double blocked_sum(const T* x, size_t n, F f) {
    constexpr size_t kBlock = size_t(1) << 14;
    size_t blocks = (n + kBlock - 1) / kBlock;
    std::vector<double> partial(blocks);
#pragma omp parallel for schedule(static)
    for (size_t blk = 0; blk < blocks; blk++) {
        const T* xb = x + blk * kBlock;
        size_t len = std::min(kBlock, n - blk * kBlock);
        double acc = 0.0;
#pragma omp simd reduction(+ : acc)
        for (size_t i = 0; i < len; i++) {
            acc += f(double(xb[i]));
        }
        partial[blk] = acc;
    }
    double total = 0.0;
    for (double p : partial) {
        total += p;
    }
    return total;
}

// x (n)
template <typename T>
double sum(const T* x, size_t n) {
    return blocked_sum(x, n, [](double a) { return a; });
}

// x (n)
template <typename T>
double sum_squares(const T* x, size_t n) {
    return blocked_sum(x, n, [](double a) { return a * a; });
}

// x (n) *= s
template <typename T>
void scale(T* x, float s, size_t n) {
    T st = T(s);
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; i++) {
        x[i] *= st;
    }
}

}  // namespace starling::cpu
