// What the emulator tells ThreadSanitizer and AddressSanitizer about its fibers, when the build
// uses them (GCC defines __SANITIZE_THREAD__ / __SANITIZE_ADDRESS__); no-ops otherwise.
//
// TSan: every emulated thread is a fiber of its own, switched to without synchronisation, so the
// only happens-before edges between emulated threads are the ones the emulator adds (barriers,
// warp collectives, kernel start and end). The emulator's own memory management is hidden from it
// (IgnoreAccesses): a block's shared memory allocated by whichever thread reaches its declaration
// first is not that thread's write.
// ASan: switching stacks is announced, so its stack bookkeeping follows the fibers.
#pragma once

#include <cstddef>

// The emulator's own files are built without TSan's instrumentation (STARLING_EMULATION_TSAN) but
// still make its calls.
#if defined(__SANITIZE_THREAD__) || defined(STARLING_EMULATION_TSAN)
#define STARLING_EMULATION_TSAN_HOOKS 1
#else
#define STARLING_EMULATION_TSAN_HOOKS 0
#endif

#if STARLING_EMULATION_TSAN_HOOKS
#include <sanitizer/tsan_interface.h>
extern "C" void AnnotateIgnoreReadsBegin(const char* file, int line);
extern "C" void AnnotateIgnoreReadsEnd(const char* file, int line);
extern "C" void AnnotateIgnoreWritesBegin(const char* file, int line);
extern "C" void AnnotateIgnoreWritesEnd(const char* file, int line);
#endif
#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif

namespace starling::cuda::emulation::sanitizer {

inline constexpr bool kThread =
#if STARLING_EMULATION_TSAN_HOOKS
    true;
#else
    false;
#endif
inline constexpr bool kAddress =
#if defined(__SANITIZE_ADDRESS__)
    true;
#else
    false;
#endif

// TSan's identity of the running fiber or thread; null without TSan.
inline void* current_fiber() {
#if STARLING_EMULATION_TSAN_HOOKS
    return __tsan_get_current_fiber();
#else
    return nullptr;
#endif
}

inline void* create_fiber(const char* name) {
#if STARLING_EMULATION_TSAN_HOOKS
    void* fiber = __tsan_create_fiber(0);
    __tsan_set_fiber_name(fiber, name);
    return fiber;
#else
    (void)name;
    return nullptr;
#endif
}

inline void name_fiber(void* fiber, const char* name) {
#if STARLING_EMULATION_TSAN_HOOKS
    __tsan_set_fiber_name(fiber, name);
#else
    (void)fiber, (void)name;
#endif
}

// Called right before the context switch to `fiber`; creates no happens-before edge.
inline void switch_to(void* fiber) {
#if STARLING_EMULATION_TSAN_HOOKS
    __tsan_switch_to_fiber(fiber, __tsan_switch_to_fiber_no_sync);
#else
    (void)fiber;
#endif
}

inline void release(void* token) {
#if STARLING_EMULATION_TSAN_HOOKS
    __tsan_release(token);
#else
    (void)token;
#endif
}

inline void acquire(void* token) {
#if STARLING_EMULATION_TSAN_HOOKS
    __tsan_acquire(token);
#else
    (void)token;
#endif
}

// While alive, TSan records no access of this thread and treats allocations as fresh memory.
class IgnoreAccesses {
public:
    IgnoreAccesses() {
#if STARLING_EMULATION_TSAN_HOOKS
        AnnotateIgnoreReadsBegin(__FILE__, __LINE__);
        AnnotateIgnoreWritesBegin(__FILE__, __LINE__);
#endif
    }
    ~IgnoreAccesses() {
#if STARLING_EMULATION_TSAN_HOOKS
        AnnotateIgnoreWritesEnd(__FILE__, __LINE__);
        AnnotateIgnoreReadsEnd(__FILE__, __LINE__);
#endif
    }
    IgnoreAccesses(const IgnoreAccesses&) = delete;
    IgnoreAccesses& operator=(const IgnoreAccesses&) = delete;
};

// ASan's stack switch protocol: start before leaving a stack (fake_stack null when the stack is
// left for good), finish on arrival.
inline void start_switch(void** fake_stack, const void* bottom, size_t size) {
#if defined(__SANITIZE_ADDRESS__)
    __sanitizer_start_switch_fiber(fake_stack, bottom, size);
#else
    (void)fake_stack, (void)bottom, (void)size;
#endif
}

inline void finish_switch(void* fake_stack, const void** old_bottom, size_t* old_size) {
#if defined(__SANITIZE_ADDRESS__)
    __sanitizer_finish_switch_fiber(fake_stack, old_bottom, old_size);
#else
    (void)fake_stack, (void)old_bottom, (void)old_size;
#endif
}

// A stack abandoned mid-call keeps ASan's poisoned redzones; clear them before it is reused.
inline void unpoison(void* p, size_t bytes) {
#if defined(__SANITIZE_ADDRESS__)
    __asan_unpoison_memory_region(p, bytes);
#else
    (void)p, (void)bytes;
#endif
}

}  // namespace starling::cuda::emulation::sanitizer
