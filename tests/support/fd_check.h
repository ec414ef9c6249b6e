// Central-difference gradient checks, shared by the op tests and the whole-model check.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <functional>
#include <numeric>
#include <vector>

namespace starling::test {

// Largest |analytic[i] - numeric[i]| over the given indices, relative to the largest |numeric[i]|
// (floored at 1e-8 so an all-zero gradient is compared absolutely). numeric[i] is the central
// difference of loss() as param[i] moves by +-h. The loss must read param[i] afresh on every
// call; param is restored bit for bit. Run it in double: in float, rounding swamps the
// difference quotient.
template <typename T>
double fd_max_rel_error(const std::function<double()>& loss, T* param, const T* analytic,
                        const std::vector<size_t>& indices, double h = 1e-6) {
    double max_diff = 0.0;
    double max_numeric = 0.0;
    for (size_t i : indices) {
        T saved = param[i];
        T plus = T(double(saved) + h);
        T minus = T(double(saved) - h);
        param[i] = plus;
        double loss_plus = loss();
        param[i] = minus;
        double loss_minus = loss();
        param[i] = saved;
        // Divide by the step actually taken, which differs from 2h once rounded to T.
        double numeric = (loss_plus - loss_minus) / (double(plus) - double(minus));
        max_diff = std::max(max_diff, std::abs(double(analytic[i]) - numeric));
        max_numeric = std::max(max_numeric, std::abs(numeric));
    }
    return max_diff / std::max(1e-8, max_numeric);
}

// Every element of an n-element parameter.
template <typename T>
double fd_max_rel_error(const std::function<double()>& loss, T* param, const T* analytic, size_t n,
                        double h = 1e-6) {
    std::vector<size_t> all(n);
    std::iota(all.begin(), all.end(), size_t(0));
    return fd_max_rel_error(loss, param, analytic, all, h);
}

}  // namespace starling::test
