#include "common/side_by_side.h"

#include <algorithm>

namespace starling {

// errors_ holds one exception_ptr per slot; bugprone-throw-keyword-missing takes its construction
// for an exception created and not thrown.
SideBySide::SideBySide(size_t slots)
    : errors_(slots == 0 ? 1 : slots) {  // NOLINT(bugprone-throw-keyword-missing)
    for (size_t slot = 1; slot < slots; slot++)
        workers_.emplace_back([this, slot] { serve(slot); });
}

SideBySide::~SideBySide() {
    {
        const MutexLock lock(mutex_);
        stopping_ = true;
    }
    start_.notify_all();
    for (std::thread& worker : workers_) worker.join();
}

void SideBySide::serve(size_t slot) {
    uint64_t served = 0;
    MutexLock lock(mutex_);
    while (true) {
        lock.wait(start_, [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) {
            return stopping_ || generation_ != served;
        });
        if (stopping_) return;
        served = generation_;
        const std::function<void(size_t)>& work = *work_;
        lock.unlock();
        try {
            work(slot);
        } catch (...) {
            errors_[slot] = std::current_exception();  // each slot writes only its own entry
        }
        lock.lock();
        if (--running_ == 0) done_.notify_one();
    }
}

void SideBySide::run(const std::function<void(size_t)>& work) {
    {
        const MutexLock lock(mutex_);
        work_ = &work;
        std::fill(errors_.begin(), errors_.end(), nullptr);
        running_ = workers_.size();
        generation_++;
    }
    start_.notify_all();
    try {
        work(0);
    } catch (...) {
        errors_[0] = std::current_exception();
    }
    MutexLock lock(mutex_);
    lock.wait(done_, [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) { return running_ == 0; });
    for (const std::exception_ptr& error : errors_) {
        if (error) std::rethrow_exception(error);
    }
}

}  // namespace starling
