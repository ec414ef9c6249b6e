// Planted lock mistakes the lint ctest (clang_tidy.py) must find with the repository's .clang-tidy
// before it trusts a clean run: every line marked PLANTED is one finding, and nothing else is.
// Never compiled into a program.
#include <condition_variable>

#include "common/mutex.h"

namespace starling::planted {

class Counter {
public:
    void add_unlocked() { count_++; }  // PLANTED: written without the mutex

    int read_after_unlock() {
        MutexLock lock(mutex_);
        lock.unlock();
        return count_;  // PLANTED: read after the lock let go
    }

    void call_without_lock() { add_locked(); }  // PLANTED: needs mutex_ held

    void wait_with_unannotated_predicate() {
        MutexLock lock(mutex_);
        lock.wait(changed_, [&] { return count_ > 0; });  // PLANTED: predicate says no REQUIRES
    }

    void correct() ABSL_LOCKS_EXCLUDED(mutex_) {
        MutexLock lock(mutex_);
        lock.wait(changed_, [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) { return count_ > 0; });
        add_locked();
        lock.unlock();
        lock.lock();
        count_++;
    }

private:
    void add_locked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) { count_++; }

    Mutex mutex_;
    std::condition_variable changed_;
    int count_ ABSL_GUARDED_BY(mutex_) = 0;
};

}  // namespace starling::planted
