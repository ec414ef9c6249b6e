#include "kernels/cuda/cublas_library.cuh"

#include <dlfcn.h>

#include <string>

#include "common/error.h"

namespace starling::cuda {

namespace {

// The soname of the cuBLAS these headers belong to, e.g. libcublas.so.13.
const std::string& library_name() {
    static const std::string name = "libcublas.so." + std::to_string(CUBLAS_VER_MAJOR);
    return name;
}

template <typename F>
void bind(void* handle, const char* symbol, F& out) {
    void* found = dlsym(handle, symbol);
    if (found == nullptr) {
        throw Error(library_name() + ": no symbol " + symbol + " (" + dlerror() + ")");
    }
    out = reinterpret_cast<F>(found);
}

CublasLibrary open_library() {
    // Never closed: cuBLAS handles may live until the process exits.
    void* handle = dlopen(library_name().c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) throw Error("cannot load " + library_name() + ": " + dlerror());
    CublasLibrary lib{};
    bind(handle, "cublasCreate_v2", lib.create);
    bind(handle, "cublasDestroy_v2", lib.destroy);
    bind(handle, "cublasSetStream_v2", lib.set_stream);
    bind(handle, "cublasSetMathMode", lib.set_math_mode);
    bind(handle, "cublasSgemm_v2", lib.sgemm);
    bind(handle, "cublasGemmEx", lib.gemm_ex);
    bind(handle, "cublasGetStatusString", lib.status_string);
    return lib;
}

}  // namespace

const CublasLibrary& CublasLibrary::get() {
    static const CublasLibrary lib = open_library();
    return lib;
}

}  // namespace starling::cuda
