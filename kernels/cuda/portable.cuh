// The two things a kernel file does differently on a device and on the emulator
// (kernels/cuda/emulation/): launching a kernel and declaring its shared memory. Kernel bodies are
// otherwise the same source for nvcc and for g++.
//
//   launch<kernel>(grid, block, dynamic_shared_bytes, stream, args...)   instead of <<<>>>
//   STARLING_SHARED(float, tile, [64][65]);        instead of __shared__ float tile[64][65]
//   STARLING_DYNAMIC_SHARED(unsigned char, smem);  instead of extern __shared__ unsigned char
//   smem[]
//
// Both kinds of shared memory are 16-byte aligned (dynamic: 128), as WMMA and float4 need.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <utility>

#if STARLING_CUDA_EMULATION
#include "kernels/cuda/emulation/launch.h"

#define STARLING_SHARED(T, name, dims)                                        \
    using name##_shared_type = T dims;                                        \
    name##_shared_type& name =                                                \
        ::starling::cuda::emulation::shared_variable<name##_shared_type>([] { \
            static const char site = 0;                                       \
            return static_cast<const void*>(&site);                           \
        }())
#define STARLING_DYNAMIC_SHARED(T, name) \
    T* const name = ::starling::cuda::emulation::dynamic_shared<T>()
#else
#define STARLING_SHARED(T, name, dims) __shared__ __align__(16) T name dims
#define STARLING_DYNAMIC_SHARED(T, name) extern __shared__ __align__(128) T name[]
#endif

namespace starling::cuda {

// Enqueues Kernel on `stream`; a bad launch configuration shows in cudaGetLastError() as it does
// with <<<>>>. On the emulator the kernel runs before this returns.
template <auto Kernel, typename... Args>
void launch(dim3 grid, dim3 block, size_t dynamic_shared_bytes, cudaStream_t stream,
            Args&&... args) {
#if STARLING_CUDA_EMULATION
    emulation::launch<Kernel>(grid, block, dynamic_shared_bytes, stream,
                              std::forward<Args>(args)...);
#else
    Kernel<<<grid, block, dynamic_shared_bytes, stream>>>(std::forward<Args>(args)...);
#endif
}

}  // namespace starling::cuda
