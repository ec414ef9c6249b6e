// Says yes at most once per interval: for warnings that a flood of bad input would otherwise
// repeat on every line of the log.
#pragma once

#include <chrono>
#include <optional>

namespace starling {

class Throttle {
public:
    using Clock = std::chrono::steady_clock;
    explicit Throttle(Clock::duration interval) : interval_(interval) {}

    // True the first time, then once `interval` has passed since the last true. Not thread-safe:
    // the caller guards it.
    bool due(Clock::time_point now = Clock::now()) {
        if (last_ && now - *last_ < interval_) return false;
        last_ = now;
        return true;
    }

private:
    Clock::duration interval_;
    std::optional<Clock::time_point> last_;
};

}  // namespace starling
