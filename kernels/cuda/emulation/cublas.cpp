// cuBLAS on OpenBLAS: the operands are copied out of (emulated) device memory, rounded as the
// device's tensor cores would take them, and multiplied in fp32.
#include "kernels/cuda/emulation/cublas.h"

#include <cblas.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include <cuda_bf16.h>

struct cublasContext {
    cudaStream_t stream = nullptr;
    cublasMath_t math = CUBLAS_DEFAULT_MATH;
};

namespace {

// TF32: 10 mantissa bits, round to nearest even (NaN and Inf pass through).
float to_tf32(float x) {
    uint32_t u;
    std::memcpy(&u, &x, sizeof u);
    if ((u & 0x7f800000u) != 0x7f800000u) u = (u + 0xfffu + ((u >> 13) & 1u)) & 0xffffe000u;
    std::memcpy(&x, &u, sizeof x);
    return x;
}

// Elements of a column-major (rows x cols) operand with leading dimension ld.
size_t extent(int rows, int cols, int ld) {
    return rows == 0 || cols == 0 ? 0 : size_t(cols - 1) * size_t(ld) + size_t(rows);
}

struct Shape {
    int a_rows, a_cols, b_rows, b_cols;
};

Shape shape_of(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k) {
    return {ta == CUBLAS_OP_N ? m : k, ta == CUBLAS_OP_N ? k : m, tb == CUBLAS_OP_N ? k : n,
            tb == CUBLAS_OP_N ? n : k};
}

bool valid(cublasHandle_t handle, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
           int lda, int ldb, int ldc) {
    if (handle == nullptr) return false;
    if (m < 0 || n < 0 || k < 0) return false;
    const Shape s = shape_of(ta, tb, m, n, k);
    return lda >= std::max(1, s.a_rows) && ldb >= std::max(1, s.b_rows) && ldc >= std::max(1, m);
}

// Device memory must hold every element the product reads or writes.
bool on_device(const void* p, size_t elements, size_t element_bytes) {
    using starling::cuda::emulation::is_device_pointer;
    return elements == 0 ||
           (is_device_pointer(p) &&
            is_device_pointer(static_cast<const char*>(p) + elements * element_bytes - 1));
}

// Sets the element counts of A and B that the product reads; false unless A and B (elements of
// ab_bytes) and C (fp32) lie wholly in device memory.
bool operands_on_device(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                        const void* A, int lda, const void* B, int ldb, const void* C, int ldc,
                        size_t ab_bytes, size_t& a_count, size_t& b_count) {
    const Shape s = shape_of(ta, tb, m, n, k);
    a_count = extent(s.a_rows, s.a_cols, lda);
    b_count = extent(s.b_rows, s.b_cols, ldb);
    return on_device(A, a_count, ab_bytes) && on_device(B, b_count, ab_bytes) &&
           on_device(C, extent(m, n, ldc), 4);
}

void gemm(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, float alpha,
          const float* A, int lda, const float* B, int ldb, float beta, float* C, int ldc) {
    if (m == 0 || n == 0) return;
    cblas_sgemm(CblasColMajor, ta == CUBLAS_OP_N ? CblasNoTrans : CblasTrans,
                tb == CUBLAS_OP_N ? CblasNoTrans : CblasTrans, m, n, k, alpha, A, lda, B, ldb, beta,
                C, ldc);
}

}  // namespace

cublasStatus_t cublasCreate_v2(cublasHandle_t* handle) {
    *handle = new cublasContext;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasDestroy_v2(cublasHandle_t handle) {
    if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
    delete handle;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetStream_v2(cublasHandle_t handle, cudaStream_t stream) {
    if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
    handle->stream = stream;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetMathMode(cublasHandle_t handle, cublasMath_t mode) {
    if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
    handle->math = mode;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSgemm_v2(cublasHandle_t handle, cublasOperation_t transa,
                              cublasOperation_t transb, int m, int n, int k, const float* alpha,
                              const float* A, int lda, const float* B, int ldb, const float* beta,
                              float* C, int ldc) {
    if (!valid(handle, transa, transb, m, n, k, lda, ldb, ldc)) return CUBLAS_STATUS_INVALID_VALUE;
    size_t a_count = 0, b_count = 0;
    if (!operands_on_device(transa, transb, m, n, k, A, lda, B, ldb, C, ldc, 4, a_count, b_count)) {
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    if (handle->math != CUBLAS_TF32_TENSOR_OP_MATH) {
        gemm(transa, transb, m, n, k, *alpha, A, lda, B, ldb, *beta, C, ldc);
        return CUBLAS_STATUS_SUCCESS;
    }
    std::vector<float> a(A, A + a_count), b(B, B + b_count);
    for (float& x : a) x = to_tf32(x);
    for (float& x : b) x = to_tf32(x);
    gemm(transa, transb, m, n, k, *alpha, a.data(), lda, b.data(), ldb, *beta, C, ldc);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa,
                            cublasOperation_t transb, int m, int n, int k, const void* alpha,
                            const void* A, cudaDataType Atype, int lda, const void* B,
                            cudaDataType Btype, int ldb, const void* beta, void* C,
                            cudaDataType Ctype, int ldc, cublasComputeType_t computeType,
                            cublasGemmAlgo_t algo) {
    (void)algo;
    if (!valid(handle, transa, transb, m, n, k, lda, ldb, ldc)) return CUBLAS_STATUS_INVALID_VALUE;
    if (Atype != CUDA_R_16BF || Btype != CUDA_R_16BF || Ctype != CUDA_R_32F ||
        computeType != CUBLAS_COMPUTE_32F) {
        return CUBLAS_STATUS_NOT_SUPPORTED;
    }
    size_t a_count = 0, b_count = 0;
    if (!operands_on_device(transa, transb, m, n, k, A, lda, B, ldb, C, ldc, 2, a_count, b_count)) {
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    auto widen = [](const void* p, size_t count) {
        const auto* h = static_cast<const __nv_bfloat16*>(p);
        return std::vector<float>(h, h + count);
    };
    const std::vector<float> a = widen(A, a_count), b = widen(B, b_count);
    gemm(transa, transb, m, n, k, *static_cast<const float*>(alpha), a.data(), lda, b.data(), ldb,
         *static_cast<const float*>(beta), static_cast<float*>(C), ldc);
    return CUBLAS_STATUS_SUCCESS;
}

const char* cublasGetStatusString(cublasStatus_t status) {
    switch (status) {
        case CUBLAS_STATUS_SUCCESS: return "success";
        case CUBLAS_STATUS_NOT_INITIALIZED: return "the library was not initialized";
        case CUBLAS_STATUS_INVALID_VALUE: return "an invalid numeric value was used as an argument";
        case CUBLAS_STATUS_NOT_SUPPORTED: return "the functionality requested is not supported";
    }
    return "unknown error";
}
