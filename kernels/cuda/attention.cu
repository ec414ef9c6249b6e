// Causal attention (kernels.cuh), flash-style: no (T, T) matrix exists anywhere.
//
// A block owns 64 rows of one (batch, head) (query rows in the forward and the dq kernel, key rows
// in the dk/dv kernel) and streams the other side in tiles of 32 rows staged in shared memory. A
// row is held by a group of HS/16 adjacent lanes, each keeping 16 of the head's dimensions in
// registers (chunks of four, interleaved so that a group's float4 reads of a staged row are
// contiguous and conflict-free); a dot product is the lanes' partial sums added with shuffles.
// Keeping the owned rows in registers rather than shared memory is what lets head sizes up to 128
// fit in about 32 KiB of static shared memory (only the two streamed tiles live there), and with 16
// dimensions per lane every row costs the same registers whatever the head size: the head size
// only changes the lanes per row (HS is a bucket, 16/32/64/128; the real head size is zero-padded
// up to it when rows are loaded, so the padding adds nothing to any dot product).
//
// The forward keeps a running max and sum per row (online softmax) and stores the log-sum-exp.
// The backward recomputes the probabilities from it, and to stay deterministic without atomics it
// splits into a kernel per key block (dk, dv summed over the query tiles at or after it) and one
// per query block (dq summed over the key tiles at or before it); every gradient element is
// written by exactly one thread, summed in a fixed order. Tiles entirely above the diagonal are
// never visited; blocks with the most tiles are scheduled first so they do not form the tail.
#include <cuda_runtime.h>

#include <climits>
#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>

#include "common/error.h"
#include "kernels/cuda/check.cuh"
#include "kernels/cuda/kernels.cuh"
#include "kernels/cuda/portable.cuh"

namespace starling::cuda {

namespace {

constexpr unsigned kFullMask = 0xffffffffu;
constexpr int kDimsPerLane = 16;
constexpr int kChunksPerLane = kDimsPerLane / 4;
constexpr int kBlockRows = 64;   // rows a block owns
constexpr int kTileRows = 32;    // rows of a staged tile
constexpr int kScoreBatch = 16;  // forward scores held in registers at once
constexpr int kMaxGridY = 65535;
constexpr int kDotWarps = 8;  // warps of the D = dO . O kernel, one row at a time each

static_assert(kBlockRows % kTileRows == 0, "the dk/dv kernel starts at a tile boundary");

template <int HS>
struct Layout {
    static_assert(HS % kDimsPerLane == 0 && 32 % (HS / kDimsPerLane) == 0,
                  "a row's lanes must divide a warp");
    static constexpr int kLanes = HS / kDimsPerLane;
    static constexpr int kThreads = kBlockRows * kLanes;
    // 512 resident threads an SM: up to 128 registers a thread, which the slices need.
    static constexpr int kMinBlocks = 512 / kThreads;
    static_assert(kTileRows * HS % kThreads == 0, "staging gives every thread the same count");
};

using Slice = float[kDimsPerLane];

// Dimension e of chunk u of `lane`: chunks are interleaved across a row's lanes.
template <int HS>
__device__ __forceinline__ int slice_dim(int lane, int u, int e) {
    return 4 * (lane + Layout<HS>::kLanes * u) + e;
}

// This lane's slice of a head row in global memory; zero past hs, or everywhere for a row past T.
template <int HS>
__device__ __forceinline__ void load_slice(Slice& x, const float* row, bool valid, int lane,
                                           int hs) {
#pragma unroll
    for (int u = 0; u < kChunksPerLane; u++) {
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int d = slice_dim<HS>(lane, u, e);
            x[4 * u + e] = valid && d < hs ? row[d] : 0.0f;
        }
    }
}

template <int HS>
__device__ __forceinline__ void store_slice(float* row, const Slice& x, float mul, int lane,
                                            int hs) {
#pragma unroll
    for (int u = 0; u < kChunksPerLane; u++) {
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int d = slice_dim<HS>(lane, u, e);
            if (d < hs) {
                row[d] = x[4 * u + e] * mul;
            }
        }
    }
}

// This lane's slice of a row staged in shared memory.
template <int HS>
__device__ __forceinline__ void load_staged(Slice& x, const float* row, int lane) {
#pragma unroll
    for (int u = 0; u < kChunksPerLane; u++) {
        const float4 c = reinterpret_cast<const float4*>(row)[lane + Layout<HS>::kLanes * u];
        x[4 * u] = c.x;
        x[4 * u + 1] = c.y;
        x[4 * u + 2] = c.z;
        x[4 * u + 3] = c.w;
    }
}

// The dot product of two rows held as slices by a row's lanes; every lane of the row gets the same
// value (the butterfly adds the same pairs on each lane). Every lane of the warp must call it.
template <int HS>
__device__ __forceinline__ float row_dot(const Slice& a, const Slice& b) {
    float chunk[kChunksPerLane];
#pragma unroll
    for (int u = 0; u < kChunksPerLane; u++) {
        chunk[u] = a[4 * u] * b[4 * u];
#pragma unroll
        for (int e = 1; e < 4; e++) {
            chunk[u] = fmaf(a[4 * u + e], b[4 * u + e], chunk[u]);
        }
    }
    static_assert(kChunksPerLane == 4, "the chunk sums below");
    float acc = (chunk[0] + chunk[1]) + (chunk[2] + chunk[3]);
#pragma unroll
    for (int offset = Layout<HS>::kLanes / 2; offset > 0; offset /= 2) {
        acc += __shfl_xor_sync(kFullMask, acc, offset);
    }
    return acc;
}

__device__ __forceinline__ void axpy(Slice& y, float a, const Slice& x) {
#pragma unroll
    for (int t = 0; t < kDimsPerLane; t++) {
        y[t] = fmaf(a, x[t], y[t]);
    }
}

// Rows [row0, row0 + kTileRows) of a head (rows `ld` floats apart) into shared memory, zero past
// row T or column hs. Consecutive threads read consecutive columns of a row.
template <int HS>
__device__ __forceinline__ void stage_tile(float (*tile)[HS], const float* head, size_t ld,
                                           int row0, int T, int hs) {
    constexpr int kThreads = Layout<HS>::kThreads;
#pragma unroll
    for (int r = 0; r < kTileRows * HS / kThreads; r++) {
        const int e = int(threadIdx.x) + r * kThreads;
        const int row = e / HS;
        const int d = e % HS;
        const int t = row0 + row;
        tile[row][d] = t < T && d < hs ? head[size_t(t) * ld + d] : 0.0f;
    }
}

// Where a block's thread sits: its (batch, head), its row and its lane within the row's group.
struct Place {
    int bh, b, h, row, lane;
};

template <int HS>
__device__ __forceinline__ Place place(int NH) {
    const int bh = int(blockIdx.x);
    return {bh, bh / NH, bh % NH, int(threadIdx.x) / Layout<HS>::kLanes,
            int(threadIdx.x) % Layout<HS>::kLanes};
}

// The first query row of a query-side block: the last row blocks, which see the most key tiles,
// get the lowest blockIdx.y and so are scheduled first.
__device__ __forceinline__ int query_block_start() {
    return int(gridDim.y - 1 - blockIdx.y) * kBlockRows;
}

template <int HS>
__global__ void __launch_bounds__(Layout<HS>::kThreads, Layout<HS>::kMinBlocks)
    attention_forward_kernel(float* __restrict__ out, float* __restrict__ lse,
                             const float* __restrict__ qkv, int T, int C, int NH, float scale) {
    STARLING_SHARED(float, ks, [kTileRows][HS]);
    STARLING_SHARED(float, vs, [kTileRows][HS]);
    const Place p = place<HS>(NH);
    const int hs = C / NH;
    const size_t ld = 3 * size_t(C);
    const int q0 = query_block_start();
    const int i = q0 + p.row;
    const float* q_head = qkv + size_t(p.b) * T * ld + size_t(p.h) * hs;

    Slice q;
    load_slice<HS>(q, q_head + size_t(i) * ld, i < T, p.lane, hs);
    Slice o = {};
    // m becomes finite in the first score batch, where key 0 is visible to every row (rows past T
    // too), so a later batch masked for a whole row leaves m and l as they were.
    float m = -INFINITY;
    float l = 0.0f;
    const int last_key = min(T, q0 + kBlockRows) - 1;
    for (int k0 = 0; k0 <= last_key; k0 += kTileRows) {
        __syncthreads();
        stage_tile<HS>(ks, q_head + C, ld, k0, T, hs);
        stage_tile<HS>(vs, q_head + 2 * C, ld, k0, T, hs);
        __syncthreads();

        // Scores in batches (each a step of the online softmax) bound the registers they take.
        // Keys past T lie after every real row, so the causal mask also covers the ragged end.
#pragma unroll 1
        for (int j0 = 0; j0 < kTileRows; j0 += kScoreBatch) {
            float s[kScoreBatch];
            float batch_max = -INFINITY;
#pragma unroll
            for (int jj = 0; jj < kScoreBatch; jj++) {
                Slice k;
                load_staged<HS>(k, ks[j0 + jj], p.lane);
                const float x = row_dot<HS>(q, k) * scale;
                s[jj] = k0 + j0 + jj <= i ? x : -INFINITY;
                batch_max = fmaxf(batch_max, s[jj]);
            }
            const float m_new = fmaxf(m, batch_max);
            const float alpha = expf(m - m_new);
            l *= alpha;
#pragma unroll
            for (int t = 0; t < kDimsPerLane; t++) {
                o[t] *= alpha;
            }
#pragma unroll
            for (int jj = 0; jj < kScoreBatch; jj++) {
                const float pj = expf(s[jj] - m_new);
                l += pj;
                Slice v;
                load_staged<HS>(v, vs[j0 + jj], p.lane);
                axpy(o, pj, v);
            }
            m = m_new;
        }
    }
    if (i < T) {
        store_slice<HS>(out + (size_t(p.b) * T + i) * C + size_t(p.h) * hs, o, 1.0f / l, p.lane,
                        hs);
        if (p.lane == 0) {
            lse[size_t(p.bh) * T + i] = m + logf(l);
        }
    }
}

// D_i = dO_i . O_i, one warp per row.
__global__ void __launch_bounds__(kDotWarps * 32)
    attention_row_dot_kernel(float* __restrict__ D, const float* __restrict__ dout,
                             const float* __restrict__ out, int T, int C, int NH) {
    const int bh = int(blockIdx.x);
    const int b = bh / NH;
    const int h = bh % NH;
    const int hs = C / NH;
    const int lane = int(threadIdx.x) % 32;
    for (int r = int(threadIdx.x) / 32; r < kBlockRows; r += kDotWarps) {
        const int i = int(blockIdx.y) * kBlockRows + r;
        if (i >= T) {
            break;  // the whole warp leaves together
        }
        const size_t off = (size_t(b) * T + i) * C + size_t(h) * hs;
        float acc = 0.0f;
        for (int d = lane; d < hs; d += 32) {
            acc = fmaf(dout[off + d], out[off + d], acc);
        }
        for (int offset = 16; offset > 0; offset /= 2) {
            acc += __shfl_xor_sync(kFullMask, acc, offset);
        }
        if (lane == 0) {
            D[size_t(bh) * T + i] = acc;
        }
    }
}

// dk and dv of a block of keys, summed over the queries at or after each key.
template <int HS>
__global__ void __launch_bounds__(Layout<HS>::kThreads, Layout<HS>::kMinBlocks)
    attention_backward_dkdv_kernel(float* __restrict__ dqkv, const float* __restrict__ dout,
                                   const float* __restrict__ qkv, const float* __restrict__ lse,
                                   const float* __restrict__ D, int T, int C, int NH, float scale) {
    STARLING_SHARED(float, qs, [kTileRows][HS]);
    STARLING_SHARED(float, dos, [kTileRows][HS]);
    STARLING_SHARED(float, lse_s, [kTileRows]);
    STARLING_SHARED(float, d_s, [kTileRows]);
    const Place p = place<HS>(NH);
    const int hs = C / NH;
    const size_t ld = 3 * size_t(C);
    const int k0 = int(blockIdx.y) * kBlockRows;  // the first key blocks have the most work
    const int j = k0 + p.row;
    const size_t head_off = size_t(p.b) * T * ld + size_t(p.h) * hs;
    const float* q_head = qkv + head_off;
    const float* do_head = dout + size_t(p.b) * T * C + size_t(p.h) * hs;
    const float* lse_bh = lse + size_t(p.bh) * T;
    const float* D_bh = D + size_t(p.bh) * T;

    Slice k;
    Slice v;
    load_slice<HS>(k, q_head + C + size_t(j) * ld, j < T, p.lane, hs);
    load_slice<HS>(v, q_head + 2 * C + size_t(j) * ld, j < T, p.lane, hs);
    Slice dk = {};
    Slice dv = {};
    for (int i0 = k0; i0 < T; i0 += kTileRows) {
        __syncthreads();
        stage_tile<HS>(qs, q_head, ld, i0, T, hs);
        stage_tile<HS>(dos, do_head, size_t(C), i0, T, hs);
        if (threadIdx.x < kTileRows) {
            const int i = i0 + int(threadIdx.x);
            lse_s[threadIdx.x] = i < T ? lse_bh[i] : 0.0f;
            d_s[threadIdx.x] = i < T ? D_bh[i] : 0.0f;
        }
        __syncthreads();

        // Unrolled twice, not more: the rows' loads hoisted further ahead spill on sm_90.
#pragma unroll 2
        for (int ii = 0; ii < kTileRows; ii++) {
            const int i = i0 + ii;
            Slice q;
            Slice dO;
            load_staged<HS>(q, qs[ii], p.lane);
            load_staged<HS>(dO, dos[ii], p.lane);
            const float s = row_dot<HS>(k, q) * scale;
            const float dp = row_dot<HS>(v, dO);
            // Queries past T exist only in the staged zeros and must not count.
            const float pij = i >= j && i < T ? expf(s - lse_s[ii]) : 0.0f;
            const float ds = pij * (dp - d_s[ii]) * scale;
            axpy(dv, pij, dO);
            axpy(dk, ds, q);
        }
    }
    if (j < T) {
        float* dk_row = dqkv + head_off + C + size_t(j) * ld;
        store_slice<HS>(dk_row, dk, 1.0f, p.lane, hs);
        store_slice<HS>(dk_row + C, dv, 1.0f, p.lane, hs);
    }
}

// dq of a block of queries, summed over the keys at or before each query.
template <int HS>
__global__ void __launch_bounds__(Layout<HS>::kThreads, Layout<HS>::kMinBlocks)
    attention_backward_dq_kernel(float* __restrict__ dqkv, const float* __restrict__ dout,
                                 const float* __restrict__ qkv, const float* __restrict__ lse,
                                 const float* __restrict__ D, int T, int C, int NH, float scale) {
    STARLING_SHARED(float, ks, [kTileRows][HS]);
    STARLING_SHARED(float, vs, [kTileRows][HS]);
    const Place p = place<HS>(NH);
    const int hs = C / NH;
    const size_t ld = 3 * size_t(C);
    const int q0 = query_block_start();
    const int i = q0 + p.row;
    const size_t head_off = size_t(p.b) * T * ld + size_t(p.h) * hs;
    const float* q_head = qkv + head_off;

    Slice q;
    Slice dO;
    load_slice<HS>(q, q_head + size_t(i) * ld, i < T, p.lane, hs);
    load_slice<HS>(dO, dout + (size_t(p.b) * T + i) * C + size_t(p.h) * hs, i < T, p.lane, hs);
    const float lse_i = i < T ? lse[size_t(p.bh) * T + i] : 0.0f;
    const float D_i = i < T ? D[size_t(p.bh) * T + i] : 0.0f;
    Slice dq = {};
    const int last_key = min(T, q0 + kBlockRows) - 1;
    for (int k0 = 0; k0 <= last_key; k0 += kTileRows) {
        __syncthreads();
        stage_tile<HS>(ks, q_head + C, ld, k0, T, hs);
        stage_tile<HS>(vs, q_head + 2 * C, ld, k0, T, hs);
        __syncthreads();

        for (int jj = 0; jj < kTileRows; jj++) {
            Slice k;
            Slice v;
            load_staged<HS>(k, ks[jj], p.lane);
            load_staged<HS>(v, vs[jj], p.lane);
            const float s = row_dot<HS>(q, k) * scale;
            const float dp = row_dot<HS>(dO, v);
            const float pij = k0 + jj <= i ? expf(s - lse_i) : 0.0f;
            axpy(dq, pij * (dp - D_i) * scale, k);
        }
    }
    if (i < T) {
        store_slice<HS>(dqkv + head_off + size_t(i) * ld, dq, 1.0f, p.lane, hs);
    }
}

// The head size, after checking the shape; throws for what the kernels cannot take.
int checked_head_size(const char* op, int B, int T, int C, int NH) {
    const std::string name(op);
    if (B < 0 || T < 0) {
        throw Error(name + ": negative shape B = " + std::to_string(B) +
                    ", T = " + std::to_string(T));
    }
    if (NH <= 0 || C <= 0 || C % NH != 0) {
        throw Error(name + ": C = " + std::to_string(C) +
                    " is not a positive multiple of NH = " + std::to_string(NH));
    }
    const int hs = C / NH;
    if (hs > kMaxAttentionHeadSize) {
        throw Error(name + ": head size C / NH = " + std::to_string(hs) + " exceeds " +
                    std::to_string(kMaxAttentionHeadSize));
    }
    if (int64_t(B) * NH > INT_MAX) {
        throw Error(name + ": B * NH = " + std::to_string(int64_t(B) * NH) +
                    " exceeds the grid's x limit");
    }
    if ((T + kBlockRows - 1) / kBlockRows > kMaxGridY) {
        throw Error(name + ": T = " + std::to_string(T) + " needs more than " +
                    std::to_string(kMaxGridY) + " row blocks");
    }
    return hs;
}

// Calls fn with std::integral_constant<int, HS> for the smallest bucket HS >= hs.
template <typename Fn>
void with_head_bucket(int hs, Fn&& fn) {
    if (hs <= 16) {
        fn(std::integral_constant<int, 16>{});
    } else if (hs <= 32) {
        fn(std::integral_constant<int, 32>{});
    } else if (hs <= 64) {
        fn(std::integral_constant<int, 64>{});
    } else {
        fn(std::integral_constant<int, 128>{});
    }
}

float softmax_scale(int hs) {
    return float(1.0 / std::sqrt(double(hs)));  // as the CPU computes it
}

dim3 row_block_grid(int B, int T, int NH) {
    return dim3(unsigned(B * NH), unsigned((T + kBlockRows - 1) / kBlockRows));
}

}  // namespace

void attention_forward(float* out, float* lse, const float* qkv, int B, int T, int C, int NH,
                       cudaStream_t stream) {
    const int hs = checked_head_size("attention_forward", B, T, C, NH);
    if (B == 0 || T == 0) {
        return;
    }
    const dim3 grid = row_block_grid(B, T, NH);
    const float scale = softmax_scale(hs);
    with_head_bucket(hs, [&](auto bucket) {
        constexpr int HS = decltype(bucket)::value;
        launch<attention_forward_kernel<HS>>(grid, Layout<HS>::kThreads, 0, stream, out, lse, qkv,
                                             T, C, NH, scale);
        STARLING_CUDA_CHECK(cudaGetLastError());
    });
}

void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out,
                        const float* lse, float* scratch, int B, int T, int C, int NH,
                        cudaStream_t stream) {
    const int hs = checked_head_size("attention_backward", B, T, C, NH);
    if (B == 0 || T == 0) {
        return;
    }
    const dim3 grid = row_block_grid(B, T, NH);
    const float scale = softmax_scale(hs);
    launch<attention_row_dot_kernel>(grid, kDotWarps * 32, 0, stream, scratch, dout, out, T, C, NH);
    STARLING_CUDA_CHECK(cudaGetLastError());
    with_head_bucket(hs, [&](auto bucket) {
        constexpr int HS = decltype(bucket)::value;
        launch<attention_backward_dkdv_kernel<HS>>(grid, Layout<HS>::kThreads, 0, stream, dqkv,
                                                   dout, qkv, lse, scratch, T, C, NH, scale);
        STARLING_CUDA_CHECK(cudaGetLastError());
        launch<attention_backward_dq_kernel<HS>>(grid, Layout<HS>::kThreads, 0, stream, dqkv, dout,
                                                 qkv, lse, scratch, T, C, NH, scale);
        STARLING_CUDA_CHECK(cudaGetLastError());
    });
}

}  // namespace starling::cuda
