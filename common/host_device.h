// STARLING_HD marks a function nvcc compiles for both the host and the device (and a plain inline
// one elsewhere): the arithmetic the CPU code and its tests run is the arithmetic the GPU runs.
#pragma once

#if defined(__CUDACC__)
#define STARLING_HD __host__ __device__ __forceinline__
#else
#define STARLING_HD inline
#endif
