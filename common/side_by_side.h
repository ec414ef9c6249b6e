// Runs one piece of work per slot at the same time, on threads that live as long as the object:
// how a node on several GPUs drives each device from a host thread of its own every step
// (engine/device_group.h) without starting threads per step. Slot 0 runs on the calling
// thread, slot i > 0 always on the same worker thread.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <thread>
#include <vector>

#include "common/mutex.h"

namespace starling {

class SideBySide {
public:
    explicit SideBySide(size_t slots);  // slots - 1 worker threads
    ~SideBySide();
    SideBySide(const SideBySide&) = delete;
    SideBySide& operator=(const SideBySide&) = delete;

    size_t slots() const { return workers_.size() + 1; }

    // Runs work(i) for every slot i at once and returns when all have finished. If any threw,
    // rethrows the exception of the lowest such slot. Not reentrant: one run at a time.
    void run(const std::function<void(size_t)>& work);

private:
    void serve(size_t slot);

    Mutex mutex_;
    std::condition_variable start_, done_;
    const std::function<void(size_t)>* work_ ABSL_GUARDED_BY(mutex_) = nullptr;
    // Runs started; a worker serves each generation once.
    uint64_t generation_ ABSL_GUARDED_BY(mutex_) = 0;
    size_t running_ ABSL_GUARDED_BY(mutex_) = 0;  // workers still on the current run
    bool stopping_ ABSL_GUARDED_BY(mutex_) = false;
    // Per slot, for the current run: cleared under the mutex before a run starts, then each slot's
    // thread writes only its own entry, read once every slot has reported done.
    std::vector<std::exception_ptr> errors_;
    std::vector<std::thread> workers_;
};

}  // namespace starling
