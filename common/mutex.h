// A mutex and its scoped lock that clang's thread-safety analysis understands (libstdc++'s
// std::mutex carries no attributes), annotated with Abseil's macros: members marked
// ABSL_GUARDED_BY(mutex_) are read and written only inside a MutexLock on it, or the
// -Wthread-safety check of the clang-tidy ctest fails. Under gcc the macros expand to nothing.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>

#include <absl/base/thread_annotations.h>

namespace starling {

class ABSL_LOCKABLE Mutex {
public:
    void lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() { mutex_.lock(); }
    void unlock() ABSL_UNLOCK_FUNCTION() { mutex_.unlock(); }

private:
    friend class MutexLock;
    std::mutex mutex_;
};

// Holds the mutex from construction to destruction, or between unlock() and lock(). The waits
// release it while they sleep and hold it again when they return; a predicate that reads guarded
// members says so with ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) after its parameter list.
class ABSL_SCOPED_LOCKABLE MutexLock {
public:
    explicit MutexLock(Mutex& mutex) ABSL_EXCLUSIVE_LOCK_FUNCTION(mutex) : lock_(mutex.mutex_) {}
    ~MutexLock() ABSL_UNLOCK_FUNCTION() {}
    MutexLock(const MutexLock&) = delete;
    MutexLock& operator=(const MutexLock&) = delete;

    void unlock() ABSL_UNLOCK_FUNCTION() { lock_.unlock(); }
    void lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() { lock_.lock(); }

    void wait(std::condition_variable& changed) { changed.wait(lock_); }
    template <typename Predicate>
    void wait(std::condition_variable& changed, Predicate ready) {
        changed.wait(lock_, ready);
    }
    template <typename Rep, typename Period, typename Predicate>
    bool wait_for(std::condition_variable& changed, std::chrono::duration<Rep, Period> limit,
                  Predicate ready) {
        return changed.wait_for(lock_, limit, ready);
    }
    template <typename Clock, typename Duration, typename Predicate>
    bool wait_until(std::condition_variable& changed,
                    std::chrono::time_point<Clock, Duration> deadline, Predicate ready) {
        return changed.wait_until(lock_, deadline, ready);
    }
    template <typename Clock, typename Duration>
    std::cv_status wait_until(std::condition_variable& changed,
                              std::chrono::time_point<Clock, Duration> deadline) {
        return changed.wait_until(lock_, deadline);
    }

private:
    std::unique_lock<std::mutex> lock_;
};

}  // namespace starling
