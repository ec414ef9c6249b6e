// Error checking for CUDA runtime calls: a failing call throws starling::Error naming the call,
// where it was made and cudaGetErrorString of its status.
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include "common/error.h"

namespace starling::cuda::detail {

inline void check(cudaError_t status, const char* call, const char* file, int line) {
    if (status != cudaSuccess) {
        // Clear it: a non-sticky error would otherwise be reported again by the next launch check.
        (void)cudaGetLastError();
        throw Error(std::string(call) + " failed at " + file + ":" + std::to_string(line) + ": " +
                    cudaGetErrorString(status));
    }
}

}  // namespace starling::cuda::detail

#define STARLING_CUDA_CHECK(call) ::starling::cuda::detail::check((call), #call, __FILE__, __LINE__)
