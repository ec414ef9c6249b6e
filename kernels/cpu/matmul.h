// Matmuls on OpenBLAS. Weights are (OC, IC) row-major, as in PyTorch's nn.Linear, so the forward
// multiplies by the transpose and no weight is ever copied into another layout.
#pragma once

#include <cblas.h>

namespace starling::cpu {

// One name for both precisions so the templated kernels (matmuls, attention) call a single gemm.
inline void gemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int M, int N, int K, float alpha,
                 const float* A, int lda, const float* B, int ldb, float beta, float* C, int ldc) {
    cblas_sgemm(CblasRowMajor, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

inline void gemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int M, int N, int K, double alpha,
                 const double* A, int lda, const double* B, int ldb, double beta, double* C,
                 int ldc) {
    cblas_dgemm(CblasRowMajor, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

// out (N,OC) = inp (N,IC) @ weight (OC,IC)^T (+ out when accumulate)
template <typename T>
void matmul_forward(T* out, const T* inp, const T* weight, int N, int IC, int OC, bool accumulate) {
    gemm(CblasNoTrans, CblasTrans, N, OC, IC, T(1), inp, IC, weight, IC, T(accumulate ? 1 : 0), out,
         OC);
}

// dinp (N,IC) (+)= dout (N,OC) @ weight (OC,IC); dweight (OC,IC) += dout^T @ inp (N,IC)
template <typename T>
void matmul_backward(T* dinp, T* dweight, const T* dout, const T* inp, const T* weight, int N,
                     int IC, int OC, bool accumulate_dinp) {
    if (dinp != nullptr) {
        gemm(CblasNoTrans, CblasNoTrans, N, IC, OC, T(1), dout, OC, weight, IC,
             T(accumulate_dinp ? 1 : 0), dinp, IC);
    }
    gemm(CblasTrans, CblasNoTrans, OC, IC, N, T(1), dout, OC, inp, IC, T(1), dweight, IC);
}

}  // namespace starling::cpu
