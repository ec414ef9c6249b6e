// Launch geometry and block-wide reductions shared by the training-op kernels.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>

namespace starling::cuda {

inline constexpr int kThreads = 256;
inline constexpr unsigned kFullMask = 0xffffffffu;
inline constexpr size_t kMaxGridX = size_t(1) << 20;  // grid-stride loops cover the rest

// Blocks of kThreads for n independent elements, capped so huge arenas use a grid-stride loop.
inline unsigned grid_for(size_t n) {
    const size_t blocks = (n + kThreads - 1) / kThreads;
    return unsigned(std::min(std::max<size_t>(blocks, 1), kMaxGridX));
}

template <typename T>
__device__ __forceinline__ T warp_sum(T v) {
    for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(kFullMask, v, offset);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
    for (int offset = 16; offset > 0; offset /= 2)
        v = fmaxf(v, __shfl_xor_sync(kFullMask, v, offset));
    return v;
}

// Sum over a block of kThreads threads, returned to every thread. The order of additions is fixed
// by the thread layout, so the result is the same on every run. `shared` holds kThreads / 32
// values; the call ends with the block synchronised, so it may be reused right away.
template <typename T>
__device__ T block_sum(T v, T* shared) {
    v = warp_sum(v);
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    if (lane == 0) shared[warp] = v;
    __syncthreads();
    T total = T(0);
    for (int w = 0; w < kThreads / 32; w++) total += shared[w];
    __syncthreads();
    return total;
}

__device__ inline float block_max(float v, float* shared) {
    v = warp_max(v);
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    if (lane == 0) shared[warp] = v;
    __syncthreads();
    float m = shared[0];
    for (int w = 1; w < kThreads / 32; w++) m = fmaxf(m, shared[w]);
    __syncthreads();
    return m;
}

}  // namespace starling::cuda
