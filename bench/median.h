// The figure a benchmark reports from repeated runs on a noisy machine.
#pragma once

#include <algorithm>
#include <chrono>
#include <vector>

namespace starling::bench {

// The middle value (the upper of the two middle ones for an even count); 0 for none.
inline double median(std::vector<double> values) {
    if (values.empty()) return 0;
    std::nth_element(values.begin(), values.begin() + values.size() / 2, values.end());
    return values[values.size() / 2];
}

// The median seconds of `reps` timed calls of `run`, after one untimed warm-up call.
template <typename Run>
double median_seconds(int reps, Run run) {
    using Clock = std::chrono::steady_clock;
    run();
    std::vector<double> times;
    for (int i = 0; i < reps; i++) {
        const auto start = Clock::now();
        run();
        times.push_back(std::chrono::duration<double>(Clock::now() - start).count());
    }
    return median(times);
}

}  // namespace starling::bench
