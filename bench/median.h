// The figure a benchmark reports from repeated runs on a noisy machine.
#pragma once

#include <algorithm>
#include <vector>

namespace starling::bench {

// The middle value (the upper of the two middle ones for an even count); 0 for none.
inline double median(std::vector<double> values) {
    if (values.empty()) return 0;
    std::nth_element(values.begin(), values.begin() + values.size() / 2, values.end());
    return values[values.size() / 2];
}

}  // namespace starling::bench
