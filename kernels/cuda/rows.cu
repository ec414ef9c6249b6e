// The row-wise ops: RMSNorm and the cross-entropy, one warp or one block per row, and the
// whole-arena sums. Row statistics are accumulated in double, as on the CPU; every sum is taken in
// an order fixed by the launch geometry (no atomics), so results repeat bit for bit run to run.
#include <climits>
#include <cmath>

#include "kernels/cuda/check.cuh"
#include "kernels/cuda/kernels.cuh"
#include "kernels/cuda/portable.cuh"
#include "kernels/cuda/launch.cuh"

namespace starling::cuda {

namespace {

constexpr int kWarpsPerBlock = kThreads / 32;
constexpr int kRowsPerChunk = 128;             // rows per partial sum of RMSNorm's dweight
constexpr size_t kSumChunk = size_t(1) << 14;  // elements per partial of sum / sum_squares

unsigned grid_for_rows(int N) { return unsigned((N + kWarpsPerBlock - 1) / kWarpsPerBlock); }

// One warp per row.
__global__ void rmsnorm_forward_kernel(float* out, float* rstd, const float* inp,
                                       const float* weight, int N, int C, float eps) {
    const int n = blockIdx.x * kWarpsPerBlock + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (n >= N) return;
    const float* x = inp + size_t(n) * C;
    float* y = out + size_t(n) * C;
    double ss = 0.0;
    for (int c = lane; c < C; c += 32) ss += double(x[c]) * double(x[c]);
    const float r = float(rmsnorm_rstd(warp_sum(ss), C, eps));
    if (lane == 0) rstd[n] = r;
    for (int c = lane; c < C; c += 32) y[c] = x[c] * r * weight[c];
}

// dinp, one warp per row: d/dx_k = r w_k g_k - x_k r^3 / C * sum_i g_i w_i x_i.
__global__ void rmsnorm_backward_dinp_kernel(float* dinp, const float* dout, const float* inp,
                                             const float* weight, const float* rstd, int N, int C) {
    const int n = blockIdx.x * kWarpsPerBlock + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (n >= N) return;
    const float* x = inp + size_t(n) * C;
    const float* g = dout + size_t(n) * C;
    float* dx = dinp + size_t(n) * C;
    double dot = 0.0;
    for (int c = lane; c < C; c += 32) dot += double(g[c]) * double(weight[c]) * double(x[c]);
    dot = warp_sum(dot);
    const float r = rstd[n];
    const float coef = float(dot * double(r) * double(r) * double(r) / C);
    for (int c = lane; c < C; c += 32) dx[c] += r * weight[c] * g[c] - coef * x[c];
}

// Block (channel tile, row chunk): partial dweight sums of kRowsPerChunk rows, in double.
__global__ void rmsnorm_dweight_partials_kernel(double* partials, const float* dout,
                                                const float* inp, const float* rstd, int N, int C) {
    const int c = blockIdx.x * kThreads + threadIdx.x;
    if (c >= C) return;
    const int first = blockIdx.y * kRowsPerChunk, last = min(N, first + kRowsPerChunk);
    double acc = 0.0;
    for (int n = first; n < last; n++) {
        acc += double(dout[size_t(n) * C + c]) * double(inp[size_t(n) * C + c]) * double(rstd[n]);
    }
    partials[size_t(blockIdx.y) * C + c] = acc;
}

__global__ void rmsnorm_dweight_total_kernel(float* dweight, const double* partials, int chunks,
                                             int C) {
    const int c = blockIdx.x * kThreads + threadIdx.x;
    if (c >= C) return;
    double total = 0.0;
    for (int k = 0; k < chunks; k++) total += partials[size_t(k) * C + c];
    dweight[c] += float(total);
}

// One block per row: the max, then the sum of exponentials in double.
struct RowSoftmax {
    float max;
    double sum;
};

__device__ RowSoftmax row_softmax(const float* x, int V, float* shared_max, double* shared_sum) {
    float mx = -INFINITY;
    for (int j = threadIdx.x; j < V; j += kThreads) mx = fmaxf(mx, x[j]);
    mx = block_max(mx, shared_max);
    double sum = 0.0;
    for (int j = threadIdx.x; j < V; j += kThreads) sum += double(expf(x[j] - mx));
    return RowSoftmax{mx, block_sum(sum, shared_sum)};
}

__global__ void crossentropy_forward_kernel(float* losses, const float* logits,
                                            const int32_t* targets, int V, int* bad_row) {
    STARLING_SHARED(float, shared_max, [kWarpsPerBlock]);
    STARLING_SHARED(double, shared_sum, [kWarpsPerBlock]);
    const int n = blockIdx.x;
    const int32_t target = targets[n];
    if (target < 0 || target >= V) {
        if (threadIdx.x == 0) {
            losses[n] = NAN;
            atomicMin(bad_row, n);
        }
        return;
    }
    const float* x = logits + size_t(n) * V;
    const RowSoftmax s = row_softmax(x, V, shared_max, shared_sum);
    if (threadIdx.x == 0) losses[n] = float(log(s.sum) + double(s.max) - double(x[target]));
}

// In place is safe: every x[j] feeding the row's max and sum is read before the block's barrier
// inside row_softmax, and afterwards each thread writes only the elements it reads.
__global__ void crossentropy_backward_kernel(float* dlogits, const float* logits,
                                             const int32_t* targets, float dloss, int V) {
    STARLING_SHARED(float, shared_max, [kWarpsPerBlock]);
    STARLING_SHARED(double, shared_sum, [kWarpsPerBlock]);
    const int n = blockIdx.x;
    const float* x = logits + size_t(n) * V;
    float* dx = dlogits + size_t(n) * V;
    const RowSoftmax s = row_softmax(x, V, shared_max, shared_sum);
    const float factor = float(double(dloss) / s.sum);
    for (int j = threadIdx.x; j < V; j += kThreads) dx[j] = expf(x[j] - s.max) * factor;
    __syncthreads();
    const int32_t target = targets[n];
    if (threadIdx.x == 0 && target >= 0 && target < V) dx[target] -= dloss;
}

__global__ void sum_partials_kernel(double* partials, const float* x, size_t n, bool squares) {
    STARLING_SHARED(double, shared, [kWarpsPerBlock]);
    const size_t first = blockIdx.x * kSumChunk;
    const size_t last = first + kSumChunk < n ? first + kSumChunk : n;
    double acc = 0.0;
    for (size_t i = first + threadIdx.x; i < last; i += kThreads) {
        const double v = x[i];
        acc += squares ? v * v : v;
    }
    acc = block_sum(acc, shared);
    if (threadIdx.x == 0) partials[blockIdx.x] = acc;
}

}  // namespace

void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight, int N, int C,
                     float eps, cudaStream_t stream) {
    if (N == 0) return;
    launch<rmsnorm_forward_kernel>(grid_for_rows(N), kThreads, 0, stream, out, rstd, inp, weight, N,
                                   C, eps);
    STARLING_CUDA_CHECK(cudaGetLastError());
}

size_t rmsnorm_backward_partials(int N, int C) {
    return size_t((N + kRowsPerChunk - 1) / kRowsPerChunk) * size_t(C);
}

void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp,
                      const float* weight, const float* rstd, int N, int C, double* partials,
                      cudaStream_t stream) {
    if (N == 0 || C == 0) return;
    launch<rmsnorm_backward_dinp_kernel>(grid_for_rows(N), kThreads, 0, stream, dinp, dout, inp,
                                         weight, rstd, N, C);
    STARLING_CUDA_CHECK(cudaGetLastError());
    const int chunks = (N + kRowsPerChunk - 1) / kRowsPerChunk;
    if (chunks > 65535) {  // grid.y
        throw Error("rmsnorm_backward: " + std::to_string(N) + " rows exceed " +
                    std::to_string(65535 * kRowsPerChunk));
    }
    const unsigned channel_tiles = unsigned((C + kThreads - 1) / kThreads);
    launch<rmsnorm_dweight_partials_kernel>(dim3(channel_tiles, unsigned(chunks)), kThreads, 0,
                                            stream, partials, dout, inp, rstd, N, C);
    STARLING_CUDA_CHECK(cudaGetLastError());
    launch<rmsnorm_dweight_total_kernel>(channel_tiles, kThreads, 0, stream, dweight, partials,
                                         chunks, C);
    STARLING_CUDA_CHECK(cudaGetLastError());
}

void crossentropy_forward(float* losses, const float* logits, const int32_t* targets, int N, int V,
                          int* bad_row, cudaStream_t stream) {
    if (N == 0) return;
    launch<crossentropy_forward_kernel>(unsigned(N), kThreads, 0, stream, losses, logits, targets,
                                        V, bad_row);
    STARLING_CUDA_CHECK(cudaGetLastError());
}

void crossentropy_backward(float* dlogits, const float* logits, const int32_t* targets, float dloss,
                           int N, int V, cudaStream_t stream) {
    if (N == 0) return;
    launch<crossentropy_backward_kernel>(unsigned(N), kThreads, 0, stream, dlogits, logits, targets,
                                         dloss, V);
    STARLING_CUDA_CHECK(cudaGetLastError());
}

size_t reduce_partials(size_t n) { return (n + kSumChunk - 1) / kSumChunk; }

void sum_partials(double* partials, const float* x, size_t n, bool squares, cudaStream_t stream) {
    const size_t blocks = reduce_partials(n);
    if (blocks == 0) return;
    launch<sum_partials_kernel>(unsigned(blocks), kThreads, 0, stream, partials, x, n, squares);
    STARLING_CUDA_CHECK(cudaGetLastError());
}

}  // namespace starling::cuda
