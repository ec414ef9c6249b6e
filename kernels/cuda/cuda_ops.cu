// CudaOps: device memory, transfers and cuBLAS matmuls, and thin calls into the kernels of
// kernels/cuda/*.cu. Scratch buffers (partial sums, attention's D, the embedding buckets) grow on
// first use and are then reused, so a training step allocates nothing after the first.
#include "kernels/cuda/cuda_ops.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <numeric>
#include <unordered_map>
#include <vector>

#include "common/error.h"
#include "kernels/cuda/check.cuh"
#include "kernels/cuda/cublas_library.cuh"
#include "kernels/cuda/kernels.cuh"

namespace starling::cuda {

namespace {

void check_cublas(cublasStatus_t status, const char* call, const char* file, int line) {
    if (status != CUBLAS_STATUS_SUCCESS) {
        throw Error(std::string(call) + " failed at " + file + ":" + std::to_string(line) + ": " +
                    CublasLibrary::get().status_string(status));
    }
}

#define STARLING_CUBLAS_CHECK(call) check_cublas((call), #call, __FILE__, __LINE__)

}  // namespace

struct CudaOps::Impl {
    // A device buffer that only grows; its memory counts in bytes_in_use like any alloc().
    struct Scratch {
        void* ptr = nullptr;
        size_t bytes = 0;
    };

    CudaDeviceInfo info;
    MatmulMath math = MatmulMath::Fp32;
    const CublasLibrary* blas = nullptr;  // opened once the device is known to be usable
    cudaStream_t stream = nullptr;
    cublasHandle_t cublas = nullptr;
    std::unordered_map<void*, size_t> sizes;
    size_t in_use = 0, peak = 0;
    Scratch partials, attention_d, buckets, bad_row, bf16_a, bf16_b, bf16_dout;
    std::vector<int32_t> host_tokens, host_buckets;
    std::vector<double> host_partials;

    // cudaSetDevice is per host thread, and the daemon trains on a thread of its own.
    void bind() const { STARLING_CUDA_CHECK(cudaSetDevice(info.index)); }

    void* allocate(size_t bytes) {
        bind();
        void* p = nullptr;
        const size_t rounded = std::max<size_t>(bytes, 1);
        const cudaError_t status = cudaMalloc(&p, rounded);
        if (status != cudaSuccess) {
            (void)cudaGetLastError();  // not sticky: clear it, or the next launch check reports it
            throw Error("cuda:" + std::to_string(info.index) + ": out of device memory for " +
                        std::to_string(bytes) + " bytes (" + std::to_string(in_use) +
                        " bytes in use): " + cudaGetErrorString(status));
        }
        STARLING_CUDA_CHECK(cudaMemsetAsync(p, 0, rounded, stream));
        sizes[p] = rounded;
        in_use += rounded;
        peak = std::max(peak, in_use);
        return p;
    }

    void free(void* p) {
        if (p == nullptr) return;
        const auto it = sizes.find(p);
        if (it == sizes.end()) throw Error("CudaOps::release: pointer was not allocated here");
        bind();
        STARLING_CUDA_CHECK(cudaFree(p));  // waits for the device, so nothing in flight uses it
        in_use -= it->second;
        sizes.erase(it);
    }

    template <typename T>
    T* scratch(Scratch& s, size_t count) {
        const size_t bytes = count * sizeof(T);
        if (s.bytes < bytes) {
            free(s.ptr);
            s.ptr = nullptr;
            s.bytes = 0;  // if allocate throws, a later smaller request must not get the null ptr
            s.ptr = allocate(bytes);
            s.bytes = bytes;
        }
        return static_cast<T*>(s.ptr);
    }

    void wait() { STARLING_CUDA_CHECK(cudaStreamSynchronize(stream)); }

    void to_host_bytes(void* host_dst, const void* src, size_t bytes) {
        if (bytes == 0) return;
        STARLING_CUDA_CHECK(cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDeviceToHost, stream));
        wait();
    }

    // Waits as well, so the caller may reuse or free host_src at once.
    void from_host_bytes(void* dst, const void* host_src, size_t bytes) {
        if (bytes == 0) return;
        STARLING_CUDA_CHECK(cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyHostToDevice, stream));
        wait();
    }

    // A matmul operand: count contiguous fp32 values and, where the caller rounded them already,
    // their bf16 copy.
    struct Operand {
        const float* values;
        size_t count;
        const uint16_t* bf16 = nullptr;
    };

    // x rounded to bf16 (stochastic rounding keyed by value bits and index, so rounding the same
    // values twice gives the same bits) into the scratch buffer s.
    const uint16_t* rounded(Scratch& s, const float* x, size_t count) {
        uint16_t* x16 = scratch<uint16_t>(s, std::max<size_t>(count, 1));
        to_bf16_sr(x16, x, count, stream);
        return x16;
    }

    // C = alpha op(A) op(B) + beta C, column-major, with alpha 1. In Bf16 mode each operand not
    // already rounded is rounded into scratch first.
    void gemm(cublasOperation_t op_a, cublasOperation_t op_b, int m, int n, int k, Operand A,
              int lda, Operand B, int ldb, float beta, float* C, int ldc) {
        const float one = 1.0f;
        // cuBLAS refuses a leading dimension of 0 even where k = 0 makes the product empty.
        lda = std::max(lda, 1);
        ldb = std::max(ldb, 1);
        if (math != MatmulMath::Bf16) {
            STARLING_CUBLAS_CHECK(blas->sgemm(cublas, op_a, op_b, m, n, k, &one, A.values, lda,
                                              B.values, ldb, &beta, C, ldc));
            return;
        }
        const uint16_t* a16 = A.bf16 ? A.bf16 : rounded(bf16_a, A.values, A.count);
        const uint16_t* b16 = B.bf16 ? B.bf16 : rounded(bf16_b, B.values, B.count);
        STARLING_CUBLAS_CHECK(blas->gemm_ex(cublas, op_a, op_b, m, n, k, &one, a16, CUDA_R_16BF,
                                            lda, b16, CUDA_R_16BF, ldb, &beta, C, CUDA_R_32F, ldc,
                                            CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    }

    double reduce(const float* x, size_t n, bool squares) {
        bind();
        const size_t count = reduce_partials(n);
        if (count == 0) return 0.0;
        double* device_partials = scratch<double>(partials, count);
        sum_partials(device_partials, x, n, squares, stream);
        host_partials.resize(count);
        to_host_bytes(host_partials.data(), device_partials, count * sizeof(double));
        double total = 0.0;
        for (double p : host_partials) total += p;
        return total;
    }
};

int cuda_device_count(std::string* reason) {
    int count = 0;
    const cudaError_t status = cudaGetDeviceCount(&count);
    if (status != cudaSuccess) {
        (void)cudaGetLastError();  // not sticky: clear it so a later cudaGetLastError starts clean
        if (reason != nullptr)
            *reason = std::string("cudaGetDeviceCount: ") + cudaGetErrorString(status);
        return 0;
    }
    if (count <= 0) {
        if (reason != nullptr) *reason = "no CUDA device";
        return 0;
    }
    return count;
}

CudaOps::CudaOps(int device, MatmulMath math) : impl_(std::make_unique<Impl>()) {
    std::string reason;
    const int count = cuda_device_count(&reason);
    if (device < 0 || device >= count) {
        throw Error("device cuda:" + std::to_string(device) + " is not available: " +
                    (count == 0 ? reason : std::to_string(count) + " CUDA device(s) found"));
    }
    Impl& d = *impl_;
    d.info.index = device;
    d.math = math;
    d.bind();
    cudaDeviceProp prop{};
    STARLING_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
    d.info.name = prop.name;
    d.info.sm_major = prop.major;
    d.info.sm_minor = prop.minor;
    d.info.total_bytes = prop.totalGlobalMem;
    d.blas = &CublasLibrary::get();
    STARLING_CUDA_CHECK(cudaStreamCreateWithFlags(&d.stream, cudaStreamNonBlocking));
    STARLING_CUBLAS_CHECK(d.blas->create(&d.cublas));
    STARLING_CUBLAS_CHECK(d.blas->set_stream(d.cublas, d.stream));
    // Bf16 needs no math mode: cublasGemmEx on bf16 operands uses the tensor cores by itself.
    STARLING_CUBLAS_CHECK(d.blas->set_math_mode(
        d.cublas, math == MatmulMath::Tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH));
}

CudaOps::~CudaOps() {
    Impl& d = *impl_;
    (void)cudaSetDevice(d.info.index);
    (void)cudaStreamSynchronize(d.stream);
    for (const auto& [p, bytes] : d.sizes) (void)cudaFree(p);
    if (d.cublas) (void)d.blas->destroy(d.cublas);
    if (d.stream) (void)cudaStreamDestroy(d.stream);
}

std::string CudaOps::name() const {
    return "cuda:" + std::to_string(impl_->info.index) + " (" + impl_->info.name + ")";
}

const CudaDeviceInfo& CudaOps::device() const { return impl_->info; }
MatmulMath CudaOps::matmul_math() const { return impl_->math; }
size_t CudaOps::bytes_in_use() const { return impl_->in_use; }
size_t CudaOps::peak_bytes() const { return impl_->peak; }

CUstream_st* CudaOps::stream() const { return impl_->stream; }

void CudaOps::synchronize() {
    impl_->bind();
    impl_->wait();
}

float* CudaOps::alloc(size_t n) { return static_cast<float*>(impl_->allocate(n * sizeof(float))); }

int32_t* CudaOps::alloc_tokens(size_t n) {
    return static_cast<int32_t*>(impl_->allocate(n * sizeof(int32_t)));
}

void CudaOps::release(void* p) { impl_->free(p); }

void CudaOps::fill_zero(float* x, size_t n) {
    impl_->bind();
    if (n > 0) STARLING_CUDA_CHECK(cudaMemsetAsync(x, 0, n * sizeof(float), impl_->stream));
}

void CudaOps::copy(float* dst, const float* src, size_t n) {
    impl_->bind();
    if (n > 0) {
        STARLING_CUDA_CHECK(
            cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyDeviceToDevice, impl_->stream));
    }
}

void CudaOps::to_host(float* host_dst, const float* src, size_t n) {
    impl_->bind();
    impl_->to_host_bytes(host_dst, src, n * sizeof(float));
}

void CudaOps::from_host(float* dst, const float* host_src, size_t n) {
    impl_->bind();
    impl_->from_host_bytes(dst, host_src, n * sizeof(float));
}

void CudaOps::tokens_from_host(int32_t* dst, const int32_t* host_src, size_t n) {
    impl_->bind();
    impl_->from_host_bytes(dst, host_src, n * sizeof(int32_t));
}

// cuBLAS is column-major: a row-major (R, C) matrix is its column-major (C, R) transpose, so each
// product below is the transposed one: out^T = W inp^T, dinp^T = W^T dout^T, dW^T = inp^T dout.
void CudaOps::matmul_forward(float* out, const float* inp, const float* weight, int N, int IC,
                             int OC, bool accumulate) {
    impl_->bind();
    if (N == 0 || OC == 0) return;
    impl_->gemm(CUBLAS_OP_T, CUBLAS_OP_N, OC, N, IC, {weight, size_t(OC) * IC}, IC,
                {inp, size_t(N) * IC}, IC, accumulate ? 1.0f : 0.0f, out, OC);
}

void CudaOps::matmul_backward(float* dinp, float* dweight, const float* dout, const float* inp,
                              const float* weight, int N, int IC, int OC, bool accumulate_dinp) {
    impl_->bind();
    if (IC == 0 || OC == 0) return;
    Impl& d = *impl_;
    Impl::Operand d_out{dout, size_t(N) * OC};
    // dout feeds both products: in Bf16 mode it is rounded once (the same bits either product
    // would round it to), which saves a pass over (N, OC), the logits' gradient included.
    if (d.math == MatmulMath::Bf16) d_out.bf16 = d.rounded(d.bf16_dout, dout, d_out.count);
    if (dinp != nullptr && N > 0) {
        d.gemm(CUBLAS_OP_N, CUBLAS_OP_N, IC, N, OC, {weight, size_t(OC) * IC}, IC, d_out, OC,
               accumulate_dinp ? 1.0f : 0.0f, dinp, IC);
    }
    d.gemm(CUBLAS_OP_N, CUBLAS_OP_T, IC, OC, N, {inp, size_t(N) * IC}, IC, d_out, OC, 1.0f, dweight,
           IC);
}

void CudaOps::rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight, int N,
                              int C, float eps) {
    impl_->bind();
    cuda::rmsnorm_forward(out, rstd, inp, weight, N, C, eps, impl_->stream);
}

void CudaOps::rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp,
                               const float* weight, const float* rstd, int N, int C) {
    impl_->bind();
    double* partials = impl_->scratch<double>(impl_->partials,
                                              std::max<size_t>(rmsnorm_backward_partials(N, C), 1));
    cuda::rmsnorm_backward(dinp, dweight, dout, inp, weight, rstd, N, C, partials, impl_->stream);
}

void CudaOps::rope_forward(float* qkv, int B, int T_, int C, int NH, float theta) {
    impl_->bind();
    rope_rotate_qk(qkv, B, T_, C, NH, theta, +1, impl_->stream);
}

void CudaOps::rope_backward(float* dqkv, int B, int T_, int C, int NH, float theta) {
    impl_->bind();
    rope_rotate_qk(dqkv, B, T_, C, NH, theta, -1, impl_->stream);
}

void CudaOps::attention_forward(float* out, float* lse, const float* qkv, int B, int T_, int C,
                                int NH) {
    impl_->bind();
    // In bf16 mode attention's products run on tensor cores too, as every matmul does.
    if (impl_->math == MatmulMath::Bf16) {
        attention_forward_bf16(out, lse, qkv, B, T_, C, NH, impl_->stream);
    } else {
        cuda::attention_forward(out, lse, qkv, B, T_, C, NH, impl_->stream);
    }
}

void CudaOps::attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out,
                                 const float* lse, int B, int T_, int C, int NH) {
    impl_->bind();
    float* d = impl_->scratch<float>(impl_->attention_d, std::max<size_t>(size_t(B) * NH * T_, 1));
    if (impl_->math == MatmulMath::Bf16) {
        attention_backward_bf16(dqkv, dout, qkv, out, lse, d, B, T_, C, NH, impl_->stream);
    } else {
        cuda::attention_backward(dqkv, dout, qkv, out, lse, d, B, T_, C, NH, impl_->stream);
    }
}

void CudaOps::swiglu_forward(float* out, const float* gu, int N, int F) {
    impl_->bind();
    cuda::swiglu_forward(out, gu, N, F, impl_->stream);
}

void CudaOps::swiglu_backward(float* dgu, const float* dout, const float* gu, int N, int F) {
    impl_->bind();
    cuda::swiglu_backward(dgu, dout, gu, N, F, impl_->stream);
}

void CudaOps::embedding_forward(float* out, const int32_t* tokens, const float* wte, int N, int C) {
    impl_->bind();
    cuda::embedding_forward(out, tokens, wte, N, C, impl_->stream);
}

// The rows are bucketed by token on the host (N integers, read back once per step), so each
// vocabulary row is summed whole, in row order, by one thread per channel: no atomics, and the
// same bits as the CPU.
void CudaOps::embedding_backward(float* dwte, const float* dout, const int32_t* tokens, int N,
                                 int C, int V) {
    Impl& d = *impl_;
    d.bind();
    d.host_tokens.resize(size_t(N));
    d.to_host_bytes(d.host_tokens.data(), tokens, size_t(N) * sizeof(int32_t));
    for (int n = 0; n < N; n++) {
        if (d.host_tokens[n] < 0 || d.host_tokens[n] >= V) {
            throw Error("embedding_backward: token " + std::to_string(d.host_tokens[n]) +
                        " at row " + std::to_string(n) + " is outside the vocabulary [0, " +
                        std::to_string(V) + ")");
        }
    }
    std::vector<int32_t> order(static_cast<size_t>(N));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](int32_t a, int32_t b) { return d.host_tokens[a] < d.host_tokens[b]; });
    // Layout: unique tokens (U), row_start (U + 1), rows (N).
    std::vector<int32_t> unique, starts;
    for (int i = 0; i < N; i++) {
        const int32_t token = d.host_tokens[order[i]];
        if (unique.empty() || unique.back() != token) {
            unique.push_back(token);
            starts.push_back(i);
        }
    }
    starts.push_back(N);
    const size_t U = unique.size();
    d.host_buckets.clear();
    d.host_buckets.insert(d.host_buckets.end(), unique.begin(), unique.end());
    d.host_buckets.insert(d.host_buckets.end(), starts.begin(), starts.end());
    d.host_buckets.insert(d.host_buckets.end(), order.begin(), order.end());
    int32_t* buckets = d.scratch<int32_t>(d.buckets, d.host_buckets.size());
    d.from_host_bytes(buckets, d.host_buckets.data(), d.host_buckets.size() * sizeof(int32_t));
    cuda::embedding_backward(dwte, dout, buckets, buckets + U, buckets + 2 * U + 1, int(U), C,
                             d.stream);
}

void CudaOps::crossentropy_forward(float* losses, const float* logits, const int32_t* targets,
                                   int N, int V) {
    Impl& d = *impl_;
    d.bind();
    if (N == 0) return;
    int* bad_row = d.scratch<int>(d.bad_row, 1);
    d.from_host_bytes(bad_row, &N, sizeof(int));
    cuda::crossentropy_forward(losses, logits, targets, N, V, bad_row, d.stream);
    int bad = N;
    d.to_host_bytes(&bad, bad_row, sizeof(int));
    if (bad < N) {
        int32_t target = 0;
        d.to_host_bytes(&target, targets + bad, sizeof(int32_t));
        throw Error("crossentropy_forward: target " + std::to_string(target) + " at row " +
                    std::to_string(bad) + " is outside the vocabulary [0, " + std::to_string(V) +
                    ")");
    }
}

void CudaOps::crossentropy_backward(float* dlogits, const float* logits, const int32_t* targets,
                                    float dloss, int N, int V) {
    impl_->bind();
    cuda::crossentropy_backward(dlogits, logits, targets, dloss, N, V, impl_->stream);
}

double CudaOps::sum(const float* x, size_t n) { return impl_->reduce(x, n, false); }

double CudaOps::sum_squares(const float* x, size_t n) { return impl_->reduce(x, n, true); }

void CudaOps::scale(float* x, float s, size_t n) {
    impl_->bind();
    cuda::scale(x, s, n, impl_->stream);
}

void CudaOps::adamw_update(float* params, float* m, float* v, const float* grads, size_t n,
                           const AdamWScalars& s) {
    impl_->bind();
    cuda::adamw_update(params, m, v, grads, n, s, impl_->stream);
}

}  // namespace starling::cuda
