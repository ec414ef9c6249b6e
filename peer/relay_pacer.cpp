#include "peer/relay_pacer.h"

#include <algorithm>

namespace starling {

RelayPacer::Flow::Flow(RelayPacer& pacer) : pacer_(pacer) {
    MutexLock lock(pacer_.mutex_);
    ++pacer_.flows_;
}

RelayPacer::Flow::~Flow() {
    MutexLock lock(pacer_.mutex_);
    --pacer_.flows_;
}

RelayPacer::SteadyClock::time_point RelayPacer::Flow::admit(uint64_t bytes,
                                                            SteadyClock::time_point now) {
    const double share =
        pacer_.bytes_per_s_ / static_cast<double>(std::max<size_t>(pacer_.flows(), 1));
    const auto leaves = std::max(now, free_at_);
    free_at_ = leaves + std::chrono::duration_cast<SteadyClock::duration>(
                            std::chrono::duration<double>(static_cast<double>(bytes) / share));
    return leaves;
}

size_t RelayPacer::flows() const {
    MutexLock lock(mutex_);
    return flows_;
}

}  // namespace starling
