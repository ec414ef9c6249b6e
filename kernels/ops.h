// The op interface the model and the optimizers are written against. One implementation per
// backend (kernels/cpu, later kernels/cuda), chosen at run time. Pointers are backend memory
// obtained from alloc(); token arrays are int32 in backend memory too.
//
// Conventions (as in llm.c): outputs first, then inputs, then weights, then sizes. Gradients are
// named d<name>. Dimensions: B batch, T time, C channels, NH heads, hs = C/NH head size,
// F MLP hidden size, V vocab, N = B*T rows. Matrices are row-major; a weight is (out, in).
// Time is spelled T_ in signatures because T names the scalar type there.
// Ops that produce a weight gradient ACCUMULATE into it (callers zero the gradient arena once
// per step), so tied weights and gradient accumulation need no special cases.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "kernels/math.h"

namespace starling {

template <typename T>
class Ops {
public:
    virtual ~Ops() = default;
    virtual std::string name() const = 0;
    // True when backend memory is ordinary host memory (the CPU backend), so host code may read
    // and write arenas in place instead of through to_host / from_host.
    virtual bool host_memory() const { return false; }

    // Memory.
    virtual T* alloc(size_t n) = 0;  // zero-filled
    virtual int32_t* alloc_tokens(size_t n) = 0;
    virtual void release(void* p) = 0;
    virtual void fill_zero(T* x, size_t n) = 0;
    virtual void copy(T* dst, const T* src, size_t n) = 0;  // backend to backend
    virtual void to_host(T* host_dst, const T* src, size_t n) = 0;
    virtual void from_host(T* dst, const T* host_src, size_t n) = 0;
    virtual void tokens_from_host(int32_t* dst, const int32_t* host_src, size_t n) = 0;

    // out (N,OC) = inp (N,IC) @ weight (OC,IC)^T, plus out's old value when accumulate.
    virtual void matmul_forward(T* out, const T* inp, const T* weight, int N, int IC, int OC,
                                bool accumulate) = 0;
    // dinp (N,IC) = dout (N,OC) @ weight (OC,IC), plus dinp's old value when accumulate_dinp;
    // dweight (OC,IC) += dout^T @ inp. dinp may be null (input needs no gradient).
    virtual void matmul_backward(T* dinp, T* dweight, const T* dout, const T* inp, const T* weight,
                                 int N, int IC, int OC, bool accumulate_dinp) = 0;

    // out (N,C) = inp * rstd * weight, rstd (N) = 1/sqrt(mean(inp^2) + eps).
    virtual void rmsnorm_forward(T* out, T* rstd, const T* inp, const T* weight, int N, int C,
                                 float eps) = 0;
    // dinp (N,C) += d/dinp, dweight (C) += d/dweight.
    virtual void rmsnorm_backward(T* dinp, T* dweight, const T* dout, const T* inp, const T* weight,
                                  const T* rstd, int N, int C) = 0;

    // In place on the q and k thirds of qkv (B,T,3C): rotate pairs (j, j+hs/2) of every head by
    // position * theta^(-2j/hs). Backward applies the inverse rotation to dqkv.
    virtual void rope_forward(T* qkv, int B, int T_, int C, int NH, float theta) = 0;
    virtual void rope_backward(T* dqkv, int B, int T_, int C, int NH, float theta) = 0;

    // Causal softmax attention over qkv (B,T,3C) = [q | k | v]; out (B,T,C); lse (B,NH,T) keeps
    // each row's log-sum-exp of the scaled scores so backward can recompute probabilities
    // instead of storing (B,NH,T,T).
    virtual void attention_forward(T* out, T* lse, const T* qkv, int B, int T_, int C, int NH) = 0;
    // dqkv (B,T,3C) is overwritten with the gradient for q, k and v.
    virtual void attention_backward(T* dqkv, const T* dout, const T* qkv, const T* out,
                                    const T* lse, int B, int T_, int C, int NH) = 0;

    // out (N,F) = silu(gu[:, :F]) * gu[:, F:], gu (N,2F) = [gate | up].
    virtual void swiglu_forward(T* out, const T* gu, int N, int F) = 0;
    // dgu (N,2F) is overwritten.
    virtual void swiglu_backward(T* dgu, const T* dout, const T* gu, int N, int F) = 0;

    // out (N,C) = wte (V,C)[tokens (N)].
    virtual void embedding_forward(T* out, const int32_t* tokens, const T* wte, int N, int C) = 0;
    // dwte (V,C) += scatter of dout (N,C) by tokens.
    virtual void embedding_backward(T* dwte, const T* dout, const int32_t* tokens, int N, int C,
                                    int V) = 0;

    // losses (N) = -log softmax(logits (N,V))[targets].
    virtual void crossentropy_forward(T* losses, const T* logits, const int32_t* targets, int N,
                                      int V) = 0;
    // dlogits (N,V) = (softmax(logits) - onehot(targets)) * dloss; dlogits may alias logits.
    virtual void crossentropy_backward(T* dlogits, const T* logits, const int32_t* targets,
                                       float dloss, int N, int V) = 0;

    // Sum of x, and sum of squares, accumulated in double.
    virtual double sum(const T* x, size_t n) = 0;
    virtual double sum_squares(const T* x, size_t n) = 0;
    // x *= s.
    virtual void scale(T* x, float s, size_t n) = 0;

    // AdamW over n elements of the flat arenas (params, m, v updated in place).
    virtual void adamw_update(T* params, T* m, T* v, const T* grads, size_t n,
                              const AdamWScalars& s) = 0;
};

}  // namespace starling
