// cuBLAS, opened with dlopen when the first CudaOps is made instead of linked into every binary.
// libcublasLt brings 94 KB of static thread-local storage, which glibc carves out of the stack of
// every thread the process starts; civetweb (prometheus-cpp's /metrics server) starts its threads
// with fixed 100 KB stacks, so with cuBLAS linked the metrics endpoint cannot start on any machine,
// GPU or not. A library opened later gets dynamic TLS, allocated apart from the stacks.
#pragma once

#include <cublas_v2.h>

namespace starling::cuda {

struct CublasLibrary {
    decltype(&cublasCreate_v2) create;
    decltype(&cublasDestroy_v2) destroy;
    decltype(&cublasSetStream_v2) set_stream;
    decltype(&cublasSetMathMode) set_math_mode;
    decltype(&cublasSgemm_v2) sgemm;
    // Spelled out: C++ sees cublasGemmEx overloaded (compute type or data type); the library's
    // symbol is the compute-type one.
    cublasStatus_t (*gemm_ex)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int,
                              const void*, const void*, cudaDataType, int, const void*,
                              cudaDataType, int, const void*, void*, cudaDataType, int,
                              cublasComputeType_t, cublasGemmAlgo_t);
    decltype(&cublasGetStatusString) status_string;

    // Opens libcublas once per process; throws starling::Error naming the library and what
    // dlopen or dlsym said when it cannot.
    static const CublasLibrary& get();
};

}  // namespace starling::cuda
