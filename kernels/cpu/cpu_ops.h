// The CPU backend: OpenBLAS for matmuls, OpenMP across cores for every other op. Templated on
// the scalar so the finite-difference tests can run the very same code in double precision.
#pragma once

#include "kernels/ops.h"

namespace starling {

template <typename T>
class CpuOps final : public Ops<T> {
public:
    std::string name() const override { return "cpu"; }
    bool host_memory() const override { return true; }

    T* alloc(size_t n) override;
    int32_t* alloc_tokens(size_t n) override;
    void release(void* p) override;
    void fill_zero(T* x, size_t n) override;
    void copy(T* dst, const T* src, size_t n) override;
    void to_host(T* host_dst, const T* src, size_t n) override;
    void from_host(T* dst, const T* host_src, size_t n) override;
    void tokens_from_host(int32_t* dst, const int32_t* host_src, size_t n) override;

    void matmul_forward(T* out, const T* inp, const T* weight, int N, int IC, int OC,
                        bool accumulate) override;
    void matmul_backward(T* dinp, T* dweight, const T* dout, const T* inp, const T* weight, int N,
                         int IC, int OC, bool accumulate_dinp) override;
    void rmsnorm_forward(T* out, T* rstd, const T* inp, const T* weight, int N, int C,
                         float eps) override;
    void rmsnorm_backward(T* dinp, T* dweight, const T* dout, const T* inp, const T* weight,
                          const T* rstd, int N, int C) override;
    void rope_forward(T* qkv, int B, int T_, int C, int NH, float theta) override;
    void rope_backward(T* dqkv, int B, int T_, int C, int NH, float theta) override;
    void attention_forward(T* out, T* lse, const T* qkv, int B, int T_, int C, int NH) override;
    void attention_backward(T* dqkv, const T* dout, const T* qkv, const T* out, const T* lse, int B,
                            int T_, int C, int NH) override;
    void swiglu_forward(T* out, const T* gu, int N, int F) override;
    void swiglu_backward(T* dgu, const T* dout, const T* gu, int N, int F) override;
    void embedding_forward(T* out, const int32_t* tokens, const T* wte, int N, int C) override;
    void embedding_backward(T* dwte, const T* dout, const int32_t* tokens, int N, int C,
                            int V) override;
    void crossentropy_forward(T* losses, const T* logits, const int32_t* targets, int N,
                              int V) override;
    void crossentropy_backward(T* dlogits, const T* logits, const int32_t* targets, float dloss,
                               int N, int V) override;
    double sum(const T* x, size_t n) override;
    double sum_squares(const T* x, size_t n) override;
    void scale(T* x, float s, size_t n) override;
    void adamw_update(T* params, T* m, T* v, const T* grads, size_t n,
                      const AdamWScalars& s) override;
};

// Sets the number of worker threads for our kernels and OpenBLAS (0 = all cores).
void set_cpu_threads(int threads);
int cpu_threads();

}  // namespace starling
