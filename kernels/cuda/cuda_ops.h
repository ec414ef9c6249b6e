// The CUDA backend: every op of kernels/ops.h on one NVIDIA GPU, cuBLAS for the matmuls and our
// own kernels (kernels/cuda/*.cu) for the rest. The header is plain C++ (no CUDA headers), so
// code built without nvcc can name the class; it exists only in builds where nvcc was found.
//
// All work runs in order on one stream of the chosen device. Calls that return a value to the host
// (sum, sum_squares, to_host, crossentropy_forward's target check) wait for the stream; the rest
// return once enqueued. Memory comes from cudaMalloc once per alloc() (never managed memory), and
// the backend counts what it holds so bench and the daemon can report the peak.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "kernels/ops.h"

struct CUstream_st;  // what cudaStream_t points to, named without the CUDA headers

namespace starling::cuda {

// How the matmuls multiply. Fp32: plain fp32, the reference the checks use. Tf32: tensor cores on
// fp32 operands rounded to 10 mantissa bits, fp32 accumulation. Bf16: both operands of every
// matmul are rounded to bf16 by stochastic rounding (to_bf16_sr below) just before it, the product
// runs on bf16 tensor cores with fp32 accumulation and an fp32 result; weights, gradients and
// AdamW's state stay fp32 (the master copy), so rounding error never accumulates in the weights.
enum class MatmulMath { Fp32, Tf32, Bf16 };

// Number of usable CUDA devices; 0 (never throws) when cudaGetDeviceCount fails, as it does on a
// machine without a driver. If reason is given it receives cudaGetErrorString of the failure (or
// "no CUDA device" when the call succeeds with none).
int cuda_device_count(std::string* reason = nullptr);

struct CudaDeviceInfo {
    int index = 0;
    std::string name;  // "NVIDIA H100 80GB HBM3"
    int sm_major = 0, sm_minor = 0;
    size_t total_bytes = 0;  // device memory
};

class CudaOps final : public Ops<float> {
public:
    // Throws starling::Error naming the device and the failing call when it cannot be used.
    explicit CudaOps(int device, MatmulMath math = MatmulMath::Fp32);
    ~CudaOps() override;
    CudaOps(const CudaOps&) = delete;
    CudaOps& operator=(const CudaOps&) = delete;

    std::string name() const override;  // "cuda:0 (NVIDIA H100 80GB HBM3)"
    const CudaDeviceInfo& device() const;
    MatmulMath matmul_math() const;
    // Bytes this backend holds in cudaMalloc'd memory now, and the most it ever held.
    size_t bytes_in_use() const;
    size_t peak_bytes() const;
    // Waits for every enqueued op; throws on an asynchronous kernel error.
    void synchronize();
    // The stream every op runs on, for work queued in order with them (NCCL's all-reduce).
    CUstream_st* stream() const;

    float* alloc(size_t n) override;
    int32_t* alloc_tokens(size_t n) override;
    void release(void* p) override;
    void fill_zero(float* x, size_t n) override;
    void copy(float* dst, const float* src, size_t n) override;
    void to_host(float* host_dst, const float* src, size_t n) override;
    void from_host(float* dst, const float* host_src, size_t n) override;
    void tokens_from_host(int32_t* dst, const int32_t* host_src, size_t n) override;

    void matmul_forward(float* out, const float* inp, const float* weight, int N, int IC, int OC,
                        bool accumulate) override;
    void matmul_backward(float* dinp, float* dweight, const float* dout, const float* inp,
                         const float* weight, int N, int IC, int OC, bool accumulate_dinp) override;
    void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight, int N,
                         int C, float eps) override;
    void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp,
                          const float* weight, const float* rstd, int N, int C) override;
    void rope_forward(float* qkv, int B, int T_, int C, int NH, float theta) override;
    void rope_backward(float* dqkv, int B, int T_, int C, int NH, float theta) override;
    void attention_forward(float* out, float* lse, const float* qkv, int B, int T_, int C,
                           int NH) override;
    void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out,
                            const float* lse, int B, int T_, int C, int NH) override;
    void swiglu_forward(float* out, const float* gu, int N, int F) override;
    void swiglu_backward(float* dgu, const float* dout, const float* gu, int N, int F) override;
    void embedding_forward(float* out, const int32_t* tokens, const float* wte, int N,
                           int C) override;
    void embedding_backward(float* dwte, const float* dout, const int32_t* tokens, int N, int C,
                            int V) override;
    void crossentropy_forward(float* losses, const float* logits, const int32_t* targets, int N,
                              int V) override;
    void crossentropy_backward(float* dlogits, const float* logits, const int32_t* targets,
                               float dloss, int N, int V) override;
    double sum(const float* x, size_t n) override;
    double sum_squares(const float* x, size_t n) override;
    void scale(float* x, float s, size_t n) override;
    void adamw_update(float* params, float* m, float* v, const float* grads, size_t n,
                      const AdamWScalars& s) override;

private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

}  // namespace starling::cuda
