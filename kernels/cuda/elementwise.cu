// The per-element ops: SwiGLU, RoPE, the embedding lookup, scaling and AdamW. Each thread owns
// whole elements and runs kernels/math.h's formula, so the values are the CPU's up to the last
// bit of the transcendental functions.
#include "common/random.h"
#include "common/stochastic_rounding.h"
#include "kernels/cuda/check.cuh"
#include "kernels/cuda/kernels.cuh"
#include "kernels/cuda/portable.cuh"
#include "kernels/cuda/launch.cuh"

namespace starling::cuda {

namespace {

__global__ void swiglu_forward_kernel(float* out, const float* gu, int N, int F) {
    const size_t total = size_t(N) * F;
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < total;
         i += size_t(gridDim.x) * blockDim.x) {
        const size_t n = i / F, f = i % F;
        const float* gate = gu + n * 2 * F;
        out[i] = silu(gate[f]) * gate[F + f];
    }
}

__global__ void swiglu_backward_kernel(float* dgu, const float* dout, const float* gu, int N,
                                       int F) {
    const size_t total = size_t(N) * F;
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < total;
         i += size_t(gridDim.x) * blockDim.x) {
        const size_t n = i / F, f = i % F;
        const float gate = gu[n * 2 * F + f], up = gu[n * 2 * F + F + f], g = dout[i];
        dgu[n * 2 * F + f] = g * up * silu_grad(gate);
        dgu[n * 2 * F + F + f] = g * silu(gate);
    }
}

// One thread per rotated pair. The angle is formed and rounded in double, as on the CPU, so both
// backends rotate by the same float cosine and sine.
__global__ void rope_kernel(float* qkv, int BT, int T, int C, int NH, float theta, int direction) {
    const int hs = C / NH, half = hs / 2;
    const size_t total = size_t(BT) * 2 * NH * half;
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < total;
         i += size_t(gridDim.x) * blockDim.x) {
        const int j = int(i % half);
        const size_t head = i / half;  // row * 2NH + h
        const size_t row = head / (2 * NH);
        const int h = int(head % (2 * NH));
        const int t = int(row % T);
        const double angle = double(t) * rope_inv_freq(j, hs, theta);
        const float c = float(cos(angle)), s = float(direction * sin(angle));
        float* x = qkv + row * 3 * C + size_t(h) * hs;
        rope_rotate(x[j], x[j + half], c, s);
    }
}

__global__ void embedding_forward_kernel(float* out, const int32_t* tokens, const float* wte, int N,
                                         int C) {
    const size_t total = size_t(N) * C;
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < total;
         i += size_t(gridDim.x) * blockDim.x) {
        const size_t n = i / C, c = i % C;
        out[i] = wte[size_t(tokens[n]) * C + c];
    }
}

// Block (u, channel tile): the rows of token u added in row order, as the CPU adds them.
__global__ void embedding_backward_kernel(float* dwte, const float* dout,
                                          const int32_t* unique_tokens, const int32_t* row_start,
                                          const int32_t* rows, int C) {
    const int u = blockIdx.x;
    const int c = blockIdx.y * blockDim.x + threadIdx.x;
    if (c >= C) return;
    float* dst = dwte + size_t(unique_tokens[u]) * C + c;
    float acc = *dst;
    for (int r = row_start[u]; r < row_start[u + 1]; r++) acc += dout[size_t(rows[r]) * C + c];
    *dst = acc;
}

__global__ void scale_kernel(float* x, float s, size_t n) {
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
         i += size_t(gridDim.x) * blockDim.x) {
        x[i] *= s;
    }
}

__global__ void to_bf16_sr_kernel(uint16_t* out, const float* x, size_t n) {
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
         i += size_t(gridDim.x) * blockDim.x) {
        const uint32_t bits = __float_as_uint(x[i]);
        out[i] = bf16_round_sr(bits, uint32_t(hash_index(bits, i)));
    }
}

__global__ void adamw_kernel(float* params, float* m, float* v, const float* grads, size_t n,
                             AdamWScalars s) {
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
         i += size_t(gridDim.x) * blockDim.x) {
        adamw_element(params[i], m[i], v[i], grads[i], s);
    }
}

}  // namespace

void swiglu_forward(float* out, const float* gu, int N, int F, cudaStream_t stream) {
    launch<swiglu_forward_kernel>(grid_for(size_t(N) * F), kThreads, 0, stream, out, gu, N, F);
    STARLING_CUDA_CHECK(cudaGetLastError());
}

void swiglu_backward(float* dgu, const float* dout, const float* gu, int N, int F,
                     cudaStream_t stream) {
    launch<swiglu_backward_kernel>(grid_for(size_t(N) * F), kThreads, 0, stream, dgu, dout, gu, N,
                                   F);
    STARLING_CUDA_CHECK(cudaGetLastError());
}

void rope_rotate_qk(float* qkv, int B, int T, int C, int NH, float theta, int direction,
                    cudaStream_t stream) {
    const size_t pairs = size_t(B) * T * 2 * NH * (C / NH / 2);
    if (pairs == 0) return;
    launch<rope_kernel>(grid_for(pairs), kThreads, 0, stream, qkv, B * T, T, C, NH, theta,
                        direction);
    STARLING_CUDA_CHECK(cudaGetLastError());
}

void embedding_forward(float* out, const int32_t* tokens, const float* wte, int N, int C,
                       cudaStream_t stream) {
    launch<embedding_forward_kernel>(grid_for(size_t(N) * C), kThreads, 0, stream, out, tokens, wte,
                                     N, C);
    STARLING_CUDA_CHECK(cudaGetLastError());
}

void embedding_backward(float* dwte, const float* dout, const int32_t* unique_tokens,
                        const int32_t* row_start, const int32_t* rows, int unique_count, int C,
                        cudaStream_t stream) {
    if (unique_count == 0 || C == 0) return;
    const dim3 grid(unsigned(unique_count), unsigned((C + kThreads - 1) / kThreads));
    launch<embedding_backward_kernel>(grid, kThreads, 0, stream, dwte, dout, unique_tokens,
                                      row_start, rows, C);
    STARLING_CUDA_CHECK(cudaGetLastError());
}

void scale(float* x, float s, size_t n, cudaStream_t stream) {
    if (n == 0) return;
    launch<scale_kernel>(grid_for(n), kThreads, 0, stream, x, s, n);
    STARLING_CUDA_CHECK(cudaGetLastError());
}

void to_bf16_sr(uint16_t* out, const float* x, size_t n, cudaStream_t stream) {
    if (n == 0) return;
    launch<to_bf16_sr_kernel>(grid_for(n), kThreads, 0, stream, out, x, n);
    STARLING_CUDA_CHECK(cudaGetLastError());
}

void adamw_update(float* params, float* m, float* v, const float* grads, size_t n,
                  const AdamWScalars& s, cudaStream_t stream) {
    if (n == 0) return;
    launch<adamw_kernel>(grid_for(n), kThreads, 0, stream, params, m, v, grads, n, s);
    STARLING_CUDA_CHECK(cudaGetLastError());
}

}  // namespace starling::cuda
