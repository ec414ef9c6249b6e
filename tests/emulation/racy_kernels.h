// Two kernels with a race, shared by the emulator's tests (tests/emulation/test_emulator.cpp: the
// run order shows it) and the sanitized builds' planted bugs (tests/emulation/faults/: TSan
// reports it). Each kernel's racing lines are named in tests/emulation/sanitized_faults.sh.
#pragma once

#include <cuda_runtime.h>

#include "kernels/cuda/portable.cuh"

namespace starling::test {

// Each thread reads its neighbour's slot, with or without the barrier between write and read.
template <bool kBarrier>
__global__ void rotate_kernel(int* out) {
    STARLING_SHARED(int, s, [64]);
    s[threadIdx.x] = int(threadIdx.x);
    if (kBarrier) __syncthreads();
    out[threadIdx.x] = s[(threadIdx.x + 1) % 64];
}

// Every block writes the same slot: the last block to run wins.
__global__ inline void same_slot_kernel(int* out) {
    if (threadIdx.x == 0) out[0] = int(blockIdx.x);
}

}  // namespace starling::test
