#include "kernels/cuda/cublas_library.cuh"

#include <string>

#include "kernels/cuda/shared_library.cuh"

namespace starling::cuda {

namespace {

#if STARLING_CUDA_EMULATION
// The emulator's cuBLAS (kernels/cuda/emulation/cublas.cpp) is linked in: nothing to open.
CublasLibrary open_library() {
    return {cublasCreate_v2, cublasDestroy_v2, cublasSetStream_v2,   cublasSetMathMode,
            cublasSgemm_v2,  cublasGemmEx,     cublasGetStatusString};
}
#else
CublasLibrary open_library() {
    // The soname of the cuBLAS these headers belong to, e.g. libcublas.so.13.
    const SharedLibrary library("libcublas.so." + std::to_string(CUBLAS_VER_MAJOR));
    CublasLibrary lib{};
    library.bind("cublasCreate_v2", lib.create);
    library.bind("cublasDestroy_v2", lib.destroy);
    library.bind("cublasSetStream_v2", lib.set_stream);
    library.bind("cublasSetMathMode", lib.set_math_mode);
    library.bind("cublasSgemm_v2", lib.sgemm);
    library.bind("cublasGemmEx", lib.gemm_ex);
    library.bind("cublasGetStatusString", lib.status_string);
    return lib;
}
#endif

}  // namespace

const CublasLibrary& CublasLibrary::get() {
    static const CublasLibrary lib = open_library();
    return lib;
}

}  // namespace starling::cuda
