// cuBLAS is opened at run time (kernels/cuda/cublas_library.cuh). Opening it needs no device, so
// this runs on every machine with the toolkit: the library loads and every function the backend
// calls resolves.
#include <catch2/catch.hpp>

#include <string>

#include "kernels/cuda/cublas_library.cuh"

using starling::cuda::CublasLibrary;

TEST_CASE("cuBLAS opens at run time with every function the CUDA backend calls", "[gpu][cublas]") {
    const CublasLibrary& lib = CublasLibrary::get();
    CHECK(lib.create != nullptr);
    CHECK(lib.destroy != nullptr);
    CHECK(lib.set_stream != nullptr);
    CHECK(lib.set_math_mode != nullptr);
    CHECK(lib.sgemm != nullptr);
    CHECK(lib.gemm_ex != nullptr);
    REQUIRE(lib.status_string != nullptr);
    CHECK(std::string(lib.status_string(CUBLAS_STATUS_NOT_INITIALIZED)) ==
          "the library was not initialized");
    CHECK(&CublasLibrary::get() == &lib);  // opened once
}
