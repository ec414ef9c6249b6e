// CpuOps: thin calls into the per-op kernels, plus host memory and the thread count.
#include "kernels/cpu/cpu_ops.h"

#include <omp.h>

#include <cblas.h>
#include <cstdlib>
#include <cstring>
#include <string>

#include "kernels/cpu/adamw.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/crossentropy.h"
#include "kernels/cpu/embedding.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/reduce.h"
#include "kernels/cpu/rmsnorm.h"
#include "kernels/cpu/rope.h"
#include "kernels/cpu/swiglu.h"
#include "common/error.h"

namespace starling {

namespace {

// 64-byte alignment matches a cache line and the widest vector loads; aligned_alloc needs the size
// to be a multiple of the alignment, and a zero-length request still gets a distinct pointer.
void* alloc_zeroed(size_t bytes) {
    constexpr size_t kAlign = 64;
    size_t rounded = (bytes + kAlign - 1) / kAlign * kAlign;
    if (rounded == 0) {
        rounded = kAlign;
    }
    void* p = std::aligned_alloc(kAlign, rounded);
    if (p == nullptr) {
        throw Error("cpu alloc: out of memory for " + std::to_string(bytes) + " bytes");
    }
    std::memset(p, 0, rounded);
    return p;
}

}  // namespace

template <typename T>
T* CpuOps<T>::alloc(size_t n) {
    return static_cast<T*>(alloc_zeroed(n * sizeof(T)));
}

template <typename T>
int32_t* CpuOps<T>::alloc_tokens(size_t n) {
    return static_cast<int32_t*>(alloc_zeroed(n * sizeof(int32_t)));
}

template <typename T>
void CpuOps<T>::release(void* p) {
    std::free(p);
}

template <typename T>
void CpuOps<T>::fill_zero(T* x, size_t n) {
    std::memset(x, 0, n * sizeof(T));
}

template <typename T>
void CpuOps<T>::copy(T* dst, const T* src, size_t n) {
    std::memcpy(dst, src, n * sizeof(T));
}

// Backend memory is host memory here, so transfers are plain copies.
template <typename T>
void CpuOps<T>::to_host(T* host_dst, const T* src, size_t n) {
    copy(host_dst, src, n);
}

template <typename T>
void CpuOps<T>::from_host(T* dst, const T* host_src, size_t n) {
    copy(dst, host_src, n);
}

template <typename T>
void CpuOps<T>::tokens_from_host(int32_t* dst, const int32_t* host_src, size_t n) {
    std::memcpy(dst, host_src, n * sizeof(int32_t));
}

template <typename T>
void CpuOps<T>::matmul_forward(T* out, const T* inp, const T* weight, int N, int IC, int OC,
                               bool accumulate) {
    cpu::matmul_forward(out, inp, weight, N, IC, OC, accumulate);
}

template <typename T>
void CpuOps<T>::matmul_backward(T* dinp, T* dweight, const T* dout, const T* inp, const T* weight,
                                int N, int IC, int OC, bool accumulate_dinp) {
    cpu::matmul_backward(dinp, dweight, dout, inp, weight, N, IC, OC, accumulate_dinp);
}

template <typename T>
void CpuOps<T>::rmsnorm_forward(T* out, T* rstd, const T* inp, const T* weight, int N, int C,
                                float eps) {
    cpu::rmsnorm_forward(out, rstd, inp, weight, N, C, eps);
}

template <typename T>
void CpuOps<T>::rmsnorm_backward(T* dinp, T* dweight, const T* dout, const T* inp, const T* weight,
                                 const T* rstd, int N, int C) {
    cpu::rmsnorm_backward(dinp, dweight, dout, inp, weight, rstd, N, C);
}

template <typename T>
void CpuOps<T>::rope_forward(T* qkv, int B, int T_, int C, int NH, float theta) {
    cpu::rope_forward(qkv, B, T_, C, NH, theta);
}

template <typename T>
void CpuOps<T>::rope_backward(T* dqkv, int B, int T_, int C, int NH, float theta) {
    cpu::rope_backward(dqkv, B, T_, C, NH, theta);
}

template <typename T>
void CpuOps<T>::attention_forward(T* out, T* lse, const T* qkv, int B, int T_, int C, int NH) {
    cpu::attention_forward(out, lse, qkv, B, T_, C, NH);
}

template <typename T>
void CpuOps<T>::attention_backward(T* dqkv, const T* dout, const T* qkv, const T* out, const T* lse,
                                   int B, int T_, int C, int NH) {
    cpu::attention_backward(dqkv, dout, qkv, out, lse, B, T_, C, NH);
}

template <typename T>
void CpuOps<T>::swiglu_forward(T* out, const T* gu, int N, int F) {
    cpu::swiglu_forward(out, gu, N, F);
}

template <typename T>
void CpuOps<T>::swiglu_backward(T* dgu, const T* dout, const T* gu, int N, int F) {
    cpu::swiglu_backward(dgu, dout, gu, N, F);
}

template <typename T>
void CpuOps<T>::embedding_forward(T* out, const int32_t* tokens, const T* wte, int N, int C) {
    cpu::embedding_forward(out, tokens, wte, N, C);
}

template <typename T>
void CpuOps<T>::embedding_backward(T* dwte, const T* dout, const int32_t* tokens, int N, int C,
                                   int V) {
    cpu::embedding_backward(dwte, dout, tokens, N, C, V);
}

template <typename T>
void CpuOps<T>::crossentropy_forward(T* losses, const T* logits, const int32_t* targets, int N,
                                     int V) {
    cpu::crossentropy_forward(losses, logits, targets, N, V);
}

template <typename T>
void CpuOps<T>::crossentropy_backward(T* dlogits, const T* logits, const int32_t* targets,
                                      float dloss, int N, int V) {
    cpu::crossentropy_backward(dlogits, logits, targets, dloss, N, V);
}

template <typename T>
double CpuOps<T>::sum(const T* x, size_t n) {
    return cpu::sum(x, n);
}

template <typename T>
double CpuOps<T>::sum_squares(const T* x, size_t n) {
    return cpu::sum_squares(x, n);
}

template <typename T>
void CpuOps<T>::scale(T* x, float s, size_t n) {
    cpu::scale(x, s, n);
}

template <typename T>
void CpuOps<T>::adamw_update(T* params, T* m, T* v, const T* grads, size_t n,
                             const AdamWScalars& s) {
    cpu::adamw_update(params, m, v, grads, n, s);
}

void set_cpu_threads(int threads) {
    int n = threads > 0 ? threads : omp_get_num_procs();
    omp_set_num_threads(n);
    openblas_set_num_threads(n);
}

int cpu_threads() { return omp_get_max_threads(); }

template class CpuOps<float>;
template class CpuOps<double>;

}  // namespace starling
