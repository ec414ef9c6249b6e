// A token bucket: a rate that may be exceeded by at most a burst, for the limits that shed a
// flood (calls per caller, streams and resets per connection) without timing every event.
#pragma once

#include <algorithm>
#include <chrono>

namespace starling {

class TokenBucket {
public:
    using Clock = std::chrono::steady_clock;

    // Starts full. Not thread-safe: the caller guards it.
    TokenBucket(double per_second, double burst, Clock::time_point now = Clock::now())
        : per_second_(per_second), burst_(burst), tokens_(burst), refilled_(now) {}

    // Takes `n` tokens when there are that many; takes none and says false when not.
    bool take(double n, Clock::time_point now = Clock::now()) {
        refill(now);
        if (tokens_ < n) return false;
        tokens_ -= n;
        return true;
    }

    // Takes `n` tokens whether or not there are that many: how long until the bucket is out of
    // debt again, zero when it never went in.
    Clock::duration take_on_credit(double n, Clock::time_point now = Clock::now()) {
        refill(now);
        tokens_ -= n;
        if (tokens_ >= 0) return Clock::duration::zero();
        return std::chrono::ceil<Clock::duration>(
            std::chrono::duration<double>(-tokens_ / per_second_));
    }

    Clock::time_point refilled() const { return refilled_; }

private:
    void refill(Clock::time_point now) {
        if (now <= refilled_) return;
        const double elapsed = std::chrono::duration<double>(now - refilled_).count();
        tokens_ = std::min(burst_, tokens_ + elapsed * per_second_);
        refilled_ = now;
    }

    double per_second_;
    double burst_;
    double tokens_;
    Clock::time_point refilled_;
};

}  // namespace starling
