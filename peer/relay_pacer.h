// The rate cap of what an anchor relays between members that cannot be dialed ([peer].relay_mbit):
// every flow (one direction of one relayed exchange) gets an even share of the cap while it
// lasts, so all of them together stay within it and a new exchange is not starved by one that
// began earlier. A flow's frame may leave at admit()'s time; the one after it, its bytes at the
// flow's share later. Time comes in as an argument, so the shares are testable without waiting.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>

#include "common/mutex.h"

namespace starling {

class RelayPacer {
public:
    using SteadyClock = std::chrono::steady_clock;

    explicit RelayPacer(double bytes_per_s) : bytes_per_s_(bytes_per_s) {}

    // One direction of one relayed exchange, counted among the flows from construction to
    // destruction.
    class Flow {
    public:
        explicit Flow(RelayPacer& pacer);
        ~Flow();
        Flow(const Flow&) = delete;
        Flow& operator=(const Flow&) = delete;

        // When a frame of `bytes` may leave, at the earliest `now`; the flow's next frame waits
        // `bytes` at its share of the cap past that.
        SteadyClock::time_point admit(uint64_t bytes, SteadyClock::time_point now);

    private:
        RelayPacer& pacer_;
        SteadyClock::time_point free_at_{};
    };

    size_t flows() const;

private:
    double bytes_per_s_;
    mutable Mutex mutex_;
    size_t flows_ ABSL_GUARDED_BY(mutex_) = 0;
};

}  // namespace starling
