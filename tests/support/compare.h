// Comparing float arenas: bit for bit, and by normalized error max|a - b| / max|b|, the measure
// for two computations of the same values in another summation order (devices, backends).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstring>
#include <span>

namespace starling::test {

inline bool same_bits(std::span<const float> a, std::span<const float> b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size_bytes()) == 0;
}

// max|a - b| / max|b|, the denominator floored at 1e-30 so an all-zero b still compares.
inline double normalized_error(std::span<const float> a, std::span<const float> b) {
    double diff = 0.0, scale = 0.0;
    for (size_t i = 0; i < b.size(); i++) {
        diff = std::max(diff, std::fabs(double(a[i]) - double(b[i])));
        scale = std::max(scale, std::fabs(double(b[i])));
    }
    return diff / std::max(scale, 1e-30);
}

}  // namespace starling::test
