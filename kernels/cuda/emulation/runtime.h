// The part of the CUDA runtime API the backend calls, on emulated devices. Device memory is host
// memory from malloc, filled with 0xff bytes at allocation (a NaN in every float) so that a kernel
// reading memory nobody wrote sees it; streams run their work in order on the calling thread, so
// every "asynchronous" call has finished when it returns. Devices are numbered 0 .. N-1 with N
// from STARLING_EMULATED_DEVICES (default 1); each reports compute capability 9.0.
//
// Errors follow the runtime's rules: a failing call returns its error and records it for
// cudaGetLastError, which returns and clears it.
#pragma once

#include <cstddef>

#include "kernels/cuda/emulation/scheduler.h"

enum cudaError_t {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorInvalidConfiguration = 9,
    cudaErrorInvalidDevicePointer = 17,
    cudaErrorInvalidMemcpyDirection = 21,
    cudaErrorInvalidResourceHandle = 400,
    cudaErrorInvalidDevice = 101,
    cudaErrorNoDevice = 100,
};
using cudaError = cudaError_t;

enum cudaMemcpyKind {
    cudaMemcpyHostToHost = 0,
    cudaMemcpyHostToDevice = 1,
    cudaMemcpyDeviceToHost = 2,
    cudaMemcpyDeviceToDevice = 3,
    cudaMemcpyDefault = 4,
};

enum cudaFuncAttribute {
    cudaFuncAttributeMaxDynamicSharedMemorySize = 8,
};

inline constexpr unsigned cudaStreamDefault = 0, cudaStreamNonBlocking = 1;

struct CUstream_st;
using cudaStream_t = CUstream_st*;

struct cudaDeviceProp {
    char name[256];
    size_t totalGlobalMem;
    size_t sharedMemPerBlock;
    size_t sharedMemPerBlockOptin;
    int warpSize;
    int maxThreadsPerBlock;
    int maxThreadsDim[3];
    int maxGridSize[3];
    int major, minor;
    int multiProcessorCount;
};

cudaError_t cudaGetDeviceCount(int* count);
cudaError_t cudaSetDevice(int device);
cudaError_t cudaGetDevice(int* device);
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device);
cudaError_t cudaGetLastError();
cudaError_t cudaPeekAtLastError();
const char* cudaGetErrorString(cudaError_t error);
cudaError_t cudaDeviceSynchronize();

cudaError_t cudaMalloc(void** ptr, size_t bytes);
cudaError_t cudaFree(void* ptr);
cudaError_t cudaMallocAsync(void** ptr, size_t bytes, cudaStream_t stream);
cudaError_t cudaFreeAsync(void* ptr, cudaStream_t stream);
cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t stream);
cudaError_t cudaMemset(void* ptr, int value, size_t bytes);
cudaError_t cudaMemsetAsync(void* ptr, int value, size_t bytes, cudaStream_t stream);

cudaError_t cudaStreamCreate(cudaStream_t* stream);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned flags);
cudaError_t cudaStreamDestroy(cudaStream_t stream);
cudaError_t cudaStreamSynchronize(cudaStream_t stream);

cudaError_t cudaFuncSetAttribute(const void* kernel, cudaFuncAttribute attribute, int value);
template <typename... P>
cudaError_t cudaFuncSetAttribute(void (*kernel)(P...), cudaFuncAttribute attribute, int value) {
    return cudaFuncSetAttribute(reinterpret_cast<const void*>(kernel), attribute, value);
}

namespace starling::cuda::emulation {

// True where the pointer lies in a live emulated device allocation; device_bytes_in_use counts
// every device's.
bool is_device_pointer(const void* p);
size_t device_bytes_in_use();
// Records error for cudaGetLastError and returns it.
cudaError_t record_error(cudaError_t error);
// The dynamic shared memory limit a kernel was given by cudaFuncSetAttribute (default 48 KiB).
size_t dynamic_shared_limit(const void* kernel);
// Whether stream is the null stream or one created and not yet destroyed.
bool is_live_stream(cudaStream_t stream);

}  // namespace starling::cuda::emulation
