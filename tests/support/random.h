// Small helpers for the kernel tests: reproducible random data and error measures.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <random>
#include <type_traits>
#include <vector>

namespace starling::test {

// Uniform values in [lo, hi), the same on every platform (the bits are taken by hand instead of
// through std::uniform_real_distribution, whose algorithm is implementation-defined).
template <typename T>
std::vector<T> random_vector(size_t n, uint64_t seed, double lo = -1.0, double hi = 1.0) {
    std::mt19937_64 gen(seed);
    std::vector<T> x(n);
    for (T& e : x) {
        double u = double(gen() >> 11) * 0x1.0p-53;
        e = T(lo + (hi - lo) * u);
    }
    return x;
}

// sum_i a_i r_i in double: a scalar loss whose gradient with respect to a is r.
template <typename T>
double weighted_sum(const std::vector<T>& a, const std::vector<T>& r) {
    double s = 0.0;
    for (size_t i = 0; i < a.size(); i++) {
        s += double(a[i]) * double(r[i]);
    }
    return s;
}

// max |a - ref| / max |ref| (floored at 1e-30 so an all-zero reference still compares).
template <typename T>
double max_rel_diff(const std::vector<T>& a, const std::vector<double>& ref) {
    double diff = 0.0;
    double scale = 1e-30;
    for (size_t i = 0; i < ref.size(); i++) {
        diff = std::max(diff, std::abs(double(a[i]) - ref[i]));
        scale = std::max(scale, std::abs(ref[i]));
    }
    return diff / scale;
}

// x widened to double, e.g. to serve as the reference of max_rel_diff.
template <typename T>
std::vector<double> as_double(const std::vector<T>& x) {
    return std::vector<double>(x.begin(), x.end());
}

// a - b elementwise: the part of an accumulated gradient that the op added.
template <typename T>
std::vector<T> minus(const std::vector<T>& a, const std::vector<T>& b) {
    std::vector<T> d(a.size());
    for (size_t i = 0; i < a.size(); i++) {
        d[i] = a[i] - b[i];
    }
    return d;
}

// Forward results against a double reference: rounding-level in double, float-level in float.
template <typename T>
constexpr double forward_tol() {
    return std::is_same_v<T, double> ? 1e-12 : 2e-5;
}

// Sizes of the ops that see qkv (B,T,3C) with NH heads.
struct QkvShape {
    int B, T, C, NH;
};

// Bound for fd_max_rel_error in double.
constexpr double kGradTol = 1e-6;

}  // namespace starling::test
