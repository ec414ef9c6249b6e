#include "common/allocator.h"

#include <malloc.h>

namespace starling {

bool keep_freed_buffers_for_reuse() {
    // Blocks up to 32 MiB (glibc's largest setting) come from the heap rather than mmap, and the
    // heap's top is returned to the kernel only past 128 MiB of free space. One arena: glibc's
    // per-thread arenas unmap a whole 64 MiB heap as soon as it empties, whatever the threshold,
    // and gRPC's threads allocate in bursts of that size.
    constexpr int kMmapThreshold = 32 << 20;
    constexpr int kTrimThreshold = 128 << 20;
    // mallopt is unsafe beside other threads; programs call this first thing, before any starts.
    return mallopt(M_MMAP_THRESHOLD, kMmapThreshold) == 1 &&  // NOLINT(concurrency-mt-unsafe)
           mallopt(M_TRIM_THRESHOLD, kTrimThreshold) == 1 &&  // NOLINT(concurrency-mt-unsafe)
           mallopt(M_ARENA_MAX, 1) == 1;                      // NOLINT(concurrency-mt-unsafe)
}

bool release_free_memory() { return malloc_trim(0) == 1; }

}  // namespace starling
