// The CUDA backend's kernel launchers, one .cu file per op (kernels/cuda/<op>.cu), called by
// CudaOps (kernels/cuda/cuda_ops.cu). Every pointer is device memory, every launch is enqueued on
// `stream` and returns without waiting; shapes and semantics are those of kernels/ops.h.
// Per-element formulas come from kernels/math.h, the same inline functions the CPU backend runs.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "kernels/math.h"

namespace starling::cuda {

// Row statistics in double, as on the CPU. dweight sums over rows are deterministic: per-chunk
// partials into `partials` (rmsnorm_backward_partials(N, C) floats), then added in chunk order.
void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight, int N, int C,
                     float eps, cudaStream_t stream);
size_t rmsnorm_backward_partials(int N, int C);
void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp,
                      const float* weight, const float* rstd, int N, int C, double* partials,
                      cudaStream_t stream);

// direction +1 rotates, -1 applies the inverse rotation (the backward).
void rope_rotate_qk(float* qkv, int B, int T, int C, int NH, float theta, int direction,
                    cudaStream_t stream);

void swiglu_forward(float* out, const float* gu, int N, int F, cudaStream_t stream);
void swiglu_backward(float* dgu, const float* dout, const float* gu, int N, int F,
                     cudaStream_t stream);

void embedding_forward(float* out, const int32_t* tokens, const float* wte, int N, int C,
                       cudaStream_t stream);
// dwte += the rows of dout gathered by token. The rows of each token are listed, in row order, in
// rows[row_start[u] .. row_start[u + 1]) for the u-th distinct token unique_tokens[u] (a host-built
// bucketing copied to the device), so every dwte row is summed by one thread per channel in the
// CPU's order, without atomics.
void embedding_backward(float* dwte, const float* dout, const int32_t* unique_tokens,
                        const int32_t* row_start, const int32_t* rows, int unique_count, int C,
                        cudaStream_t stream);

// losses (N) = -log softmax(logits)[target]. A target outside [0, V) leaves its loss NaN and the
// smallest such row in *bad_row (which the caller sets to N beforehand).
void crossentropy_forward(float* losses, const float* logits, const int32_t* targets, int N, int V,
                          int* bad_row, cudaStream_t stream);
// dlogits may alias logits.
void crossentropy_backward(float* dlogits, const float* logits, const int32_t* targets, float dloss,
                           int N, int V, cudaStream_t stream);

// Per-block partial sums of x (or of x^2) in double, in block order: reduce_partials(n) doubles,
// which the caller adds on the host in that order, so the result is the same on every run.
size_t reduce_partials(size_t n);
void sum_partials(double* partials, const float* x, size_t n, bool squares, cudaStream_t stream);

void scale(float* x, float s, size_t n, cudaStream_t stream);

// out[i] = bf16 of x[i] by stochastic rounding, the random bits a hash of (the value's bits, i):
// a pure function of the data, so runs repeat and resume exactly with no rounding state to keep,
// while unbiased over the ever-changing values of training.
void to_bf16_sr(uint16_t* out, const float* x, size_t n, cudaStream_t stream);
void adamw_update(float* params, float* m, float* v, const float* grads, size_t n,
                  const AdamWScalars& s, cudaStream_t stream);

// Causal attention, flash-style: q rows in tiles against k/v tiles staged in shared memory with an
// online softmax, so no (T, T) matrix exists anywhere. lse (B, NH, T) as on the CPU. The backward
// recomputes the probabilities from lse and needs `scratch` of B * NH * T floats (D_i = dO_i .
// O_i). Head sizes up to kMaxAttentionHeadSize; larger ones throw starling::Error.
inline constexpr int kMaxAttentionHeadSize = 128;
void attention_forward(float* out, float* lse, const float* qkv, int B, int T, int C, int NH,
                       cudaStream_t stream);
void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out,
                        const float* lse, float* scratch, int B, int T, int C, int NH,
                        cudaStream_t stream);
// The same two ops with the same semantics and buffers (attention_tc.cu), for the bf16 matmul
// mode: the matrix products run on bf16 tensor cores (operands, P and dS rounded to bf16, fp32
// accumulation), softmax statistics, lse and D stay fp32. Head sizes 16, 32, 64 and 128 only;
// any other shape falls back to the fp32 kernels above.
void attention_forward_bf16(float* out, float* lse, const float* qkv, int B, int T, int C, int NH,
                            cudaStream_t stream);
void attention_backward_bf16(float* dqkv, const float* dout, const float* qkv, const float* out,
                             const float* lse, float* scratch, int B, int T, int C, int NH,
                             cudaStream_t stream);

}  // namespace starling::cuda
