// What systemd's watchdog is told: that the round loop is making progress, not merely that the
// event loop is alive. The round loop marks progress at every inner step, phase change, state-copy
// chunk and wait, each mark saying how long the next one may take beyond the watchdog's own
// interval (an exchange may take T_pair + T_xchg; a wait, its length). A loop stuck past that
// (a hung CUDA call, a disk write that never returns, a deadlock) stops the pings, and systemd
// restarts the service.
#pragma once

#include <chrono>

#include "common/mutex.h"

namespace starling {

class RoundWatch {
public:
    using Clock = std::chrono::steady_clock;

    explicit RoundWatch(Clock::time_point now = Clock::now()) : marked_(now) {}

    // Progress now; the next mark may come up to `allowance` later than the watchdog's interval.
    void mark(std::chrono::milliseconds allowance = std::chrono::milliseconds(0),
              Clock::time_point now = Clock::now());
    // Whether the last mark is recent enough: within its allowance plus `interval`.
    bool healthy(std::chrono::microseconds interval, Clock::time_point now = Clock::now()) const;
    double seconds_since_mark(Clock::time_point now = Clock::now()) const;

private:
    mutable Mutex mutex_;
    Clock::time_point marked_ ABSL_GUARDED_BY(mutex_);
    std::chrono::milliseconds allowance_ ABSL_GUARDED_BY(mutex_){0};
};

}  // namespace starling
