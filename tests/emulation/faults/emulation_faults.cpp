// Kernels with one planted bug each, built with the sanitizer of the build
// (STARLING_CUDA_EMULATION_SANITIZER), for tests/emulation/sanitized_faults.sh: each must be
// reported by ThreadSanitizer (races) or AddressSanitizer (out-of-bounds accesses), naming the
// kernel and the line, and the clean kernel must pass without a report.
//
//   emulation_faults missing-barrier | two-blocks-one-slot | global-out-of-bounds |
//                    shared-out-of-bounds | clean
#include <cuda_runtime.h>

#include <cstdio>
#include <cstring>
#include <string>

#include "kernels/cuda/portable.cuh"
#include "tests/emulation/racy_kernels.h"

using starling::cuda::launch;
using starling::test::rotate_kernel;
using starling::test::same_slot_kernel;

namespace {

// Copies n values with one thread too many: the bounds guard is off by one.
__global__ void unguarded_copy_kernel(float* out, const float* in, int n) {
    const int i = int(blockIdx.x * blockDim.x + threadIdx.x);
    if (i <= n) out[i] = in[i];
}

__global__ void shared_overrun_kernel(float* out) {
    STARLING_SHARED(float, s, [32]);
    s[threadIdx.x] = float(threadIdx.x);  // 33 threads for 32 slots
    __syncthreads();
    out[threadIdx.x] = s[threadIdx.x];
}

int run(const std::string& which) {
    int* ints = nullptr;
    float *a = nullptr, *b = nullptr;
    if (cudaMalloc(reinterpret_cast<void**>(&ints), 64 * sizeof(int)) != cudaSuccess ||
        cudaMalloc(reinterpret_cast<void**>(&a), 100 * sizeof(float)) != cudaSuccess ||
        cudaMalloc(reinterpret_cast<void**>(&b), 128 * sizeof(float)) != cudaSuccess) {
        std::fprintf(stderr, "cudaMalloc failed\n");
        return 1;
    }
    if (which == "missing-barrier") {
        launch<rotate_kernel<false>>(1, 64, 0, nullptr, ints);
    } else if (which == "two-blocks-one-slot") {
        launch<same_slot_kernel>(4, 32, 0, nullptr, ints);
    } else if (which == "global-out-of-bounds") {
        launch<unguarded_copy_kernel>(1, 128, 0, nullptr, b, a, 100);
    } else if (which == "shared-out-of-bounds") {
        launch<shared_overrun_kernel>(1, 33, 0, nullptr, b);
    } else if (which == "clean") {
        launch<rotate_kernel<true>>(1, 64, 0, nullptr, ints);
        launch<unguarded_copy_kernel>(1, 100, 0, nullptr, b, a, 99);
    } else {
        std::fprintf(stderr, "unknown fault \"%s\"\n", which.c_str());
        return 2;
    }
    cudaFree(ints);
    cudaFree(a);
    cudaFree(b);
    std::printf("%s: ran\n", which.c_str());
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    if (argc != 2) {
        std::fprintf(stderr, "usage: emulation_faults FAULT\n");
        return 2;
    }
    return run(argv[1]);
}
