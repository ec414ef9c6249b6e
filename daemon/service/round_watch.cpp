#include "daemon/service/round_watch.h"

namespace starling {

void RoundWatch::mark(std::chrono::milliseconds allowance, Clock::time_point now) {
    const MutexLock lock(mutex_);
    marked_ = now;
    allowance_ = allowance;
}

bool RoundWatch::healthy(std::chrono::microseconds interval, Clock::time_point now) const {
    const MutexLock lock(mutex_);
    return now - marked_ <= allowance_ + interval;
}

double RoundWatch::seconds_since_mark(Clock::time_point now) const {
    const MutexLock lock(mutex_);
    return std::chrono::duration<double>(now - marked_).count();
}

}  // namespace starling
