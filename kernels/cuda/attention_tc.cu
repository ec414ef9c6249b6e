// Causal attention with its matrix products on bf16 tensor cores (kernels.cuh), for the bf16 matmul
// mode: the semantics of attention.cu (same fp32 inputs and outputs, same lse, no (T, T) matrix
// anywhere) with every product's operands rounded to bf16 (round to nearest even) as they are
// staged into shared memory, and P and dS rounded before theirs. Softmax statistics, lse, D and all
// accumulation stay fp32.
//
// Tiling. A block is 4 warps and owns 64 rows of one (batch, head), 16 per warp, one WMMA fragment
// high; it streams the other side in tiles of 64 rows (32 in the key-side backward at head size
// 128, to keep its shared memory at two blocks an SM), staged as bf16 in shared memory (rows padded
// by 16 bytes so that the 8 rows of one fragment load fall in different banks). Each warp works
// alone on its 16 rows against the staged tile; the block only synchronises around the staging.
//   forward   owns queries (held as A fragments), streams keys and values. Per key tile a warp
//             computes its 16 x 64 scores, stores them to its shared score buffer, does the online
//             softmax there in fp32 (two lanes per row) and writes P as bf16, which it loads back
//             as A fragments for O += P V. O lives in accumulator fragments; when a row's running
//             max moves, O goes through the score buffer to be rescaled row by row.
//   backward  is two kernels, deterministic without atomics: the query-side one owns queries,
//             streams key tiles and accumulates dQ = dS K (it first computes D = dO . O for its
//             rows into `scratch`); the key-side one owns keys, streams query tiles from the
//             block's first key and accumulates dK = dS^T Q and dV = P^T dO. Both take the
//             streamed tile 16 rows at a time: S (or S^T) and dP (or dP^T) for a 16 x 16 chunk,
//             P and dS formed elementwise in shared memory, then one fragment-high product.
// Fragments are only ever loaded, stored, filled and multiplied: every elementwise step goes
// through shared memory, so nothing depends on how a fragment spreads over the lanes. Chunks and
// fragments the causal mask hides from a whole warp (or that lie past T) are skipped.
//
// Only head sizes 16, 32, 64 and 128 run here (a fragment is 16 wide and the head is not
// zero-padded); any other head size, and any malformed shape, is passed to the fp32 kernels of
// attention.cu, which run it or throw.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <mma.h>

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

namespace wmma = nvcuda::wmma;
using bf16 = __nv_bfloat16;

constexpr unsigned kFullMask = 0xffffffffu;
constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kRows = 16 * kWarps;  // rows a block owns
constexpr int kTile = 64;           // rows of a streamed tile (32 in one case, see Backward)
constexpr int kMaxGridY = 65535;
static_assert(kTile == kRows, "forward tiles start at block boundaries: the diagonal is one tile");

// Row strides, in elements. Staged bf16 rows get 8 extra (16 bytes); fp32 buffers 4. All are
// multiples of 16 bytes as WMMA requires, and 16 rows of any of them are a multiple of 32 bytes,
// so every fragment in them starts 32-byte aligned.
template <int HS>
constexpr int kStagedLd = HS + 8;
constexpr int kScoreLd = kTile + 4;  // forward: a warp's 16 x 64 scores (fp32)
constexpr int kProbLd = kTile + 8;   // forward: a warp's 16 x 64 probabilities (bf16)
constexpr int kChunkLd = 16 + 4;     // backward: 16 x 16 fp32 chunks
constexpr int kChunkLdH = 16 + 8;    // backward: 16 x 16 bf16 chunks

using FragA = wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major>;
using FragBRow = wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::row_major>;
using FragBCol = wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major>;
using FragAcc = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;

template <int HS>
constexpr size_t tile_bytes(int rows = kTile) {
    return size_t(rows) * kStagedLd<HS> * sizeof(bf16);
}

// Hands out consecutive arrays of the dynamic shared memory. Every array size used below is a
// multiple of 32 bytes, so each array (and each warp's part of one) stays 32-byte aligned.
struct Carve {
    unsigned char* p;
    template <typename E>
    __device__ __forceinline__ E* take(size_t n) {
        E* r = reinterpret_cast<E*>(p);
        p += n * sizeof(E);
        return r;
    }
};

// Rows [row0, row0 + kN) of a head (rows `ld` floats apart, HS columns from `head`) into
// shared memory as bf16, zero past row T: a masked probability is an exact 0 and must meet 0, not
// stale bits that might be NaN. `vec` says the rows are 16-byte aligned for float4 reads.
template <int HS, int kN = kTile>
__device__ __forceinline__ void stage(bf16* dst, const float* head, size_t ld, int row0, int T,
                                      bool vec) {
    constexpr int kLd = kStagedLd<HS>;
    static_assert(kN * HS / 4 % kThreads == 0, "every thread stages the same count");
    if (vec) {
        constexpr int kQuads = HS / 4;
        // Unrolled 4 deep, not fully: loads hoisted further would take registers that the
        // accumulators, live across the staging, need.
#pragma unroll 4
        for (int n = 0; n < kN * kQuads / kThreads; n++) {
            const int e = int(threadIdx.x) + n * kThreads;
            const int r = e / kQuads;
            const int c = 4 * (e % kQuads);
            const int t = row0 + r;
            const float4 x = t < T ? *reinterpret_cast<const float4*>(head + size_t(t) * ld + c)
                                   : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            __nv_bfloat162* d = reinterpret_cast<__nv_bfloat162*>(dst + r * kLd + c);
            d[0] = __floats2bfloat162_rn(x.x, x.y);
            d[1] = __floats2bfloat162_rn(x.z, x.w);
        }
    } else {
#pragma unroll 4
        for (int n = 0; n < kN * HS / kThreads; n++) {
            const int e = int(threadIdx.x) + n * kThreads;
            const int r = e / HS;
            const int c = e % HS;
            const int t = row0 + r;
            dst[r * kLd + c] = __float2bfloat16_rn(t < T ? head[size_t(t) * ld + c] : 0.0f);
        }
    }
}

// Elementwise work on a warp's 16-row buffers: lane pair (2r, 2r + 1) takes row r, the even and
// the odd columns, so per-row statistics need one shuffle.
struct Cell {
    int lane, r, c0;
};

__device__ __forceinline__ Cell cell() {
    const int lane = int(threadIdx.x) % 32;
    return {lane, lane / 2, lane % 2};
}

// buf[r][c] *= factor (this lane's row's) for c < width.
__device__ __forceinline__ void scale_row(float* buf, int ld, int width, const Cell& e,
                                          float factor) {
    for (int c = e.c0; c < width; c += 2) {
        buf[e.r * ld + c] *= factor;
    }
}

// acc[n] += a times the row-major 16 x 16 block at b + 16 n, for each of a warp's kF accumulators
// across the head.
template <int kF>
__device__ __forceinline__ void mma_across_head(FragAcc (&acc)[kF], const FragA& a, const bf16* b,
                                                int ld) {
#pragma unroll
    for (int n = 0; n < kF; n++) {
        FragBRow bf;
        wmma::load_matrix_sync(bf, b + 16 * n, ld);
        wmma::mma_sync(acc[n], a, bf, acc[n]);
    }
}

// Writes a warp's 16 x HS accumulator rows to dst rows row0 + r < T (rows `ld` floats apart),
// kW columns at a time through buf (16 x kW floats), each row multiplied by mul[r] when mul is
// given. Coalesced: consecutive lanes write consecutive columns.
template <int HS, int kW>
__device__ void write_rows(FragAcc (&acc)[HS / 16], float* buf, int buf_ld, float* dst, size_t ld,
                           int row0, int T, const float* mul) {
    const int lane = int(threadIdx.x) % 32;
#pragma unroll
    for (int p = 0; p < HS / kW; p++) {
#pragma unroll
        for (int n = 0; n < kW / 16; n++) {
            wmma::store_matrix_sync(buf + 16 * n, acc[p * (kW / 16) + n], buf_ld,
                                    wmma::mem_row_major);
        }
        __syncwarp();
        for (int e = lane; e < 16 * kW; e += 32) {
            const int r = e / kW;
            const int c = e % kW;
            if (row0 + r < T) {
                dst[size_t(row0 + r) * ld + p * kW + c] =
                    mul ? buf[r * buf_ld + c] * mul[r] : buf[r * buf_ld + c];
            }
        }
        __syncwarp();
    }
}

// The first row of a block that owns queries: the last blocks, which see the most key tiles, get
// the lowest blockIdx.y and so are scheduled first.
__device__ __forceinline__ int query_block_start() {
    return int(gridDim.y - 1 - blockIdx.y) * kRows;
}

template <int HS>
constexpr size_t forward_smem() {
    return 2 * tile_bytes<HS>() +
           kWarps * 16 * (kScoreLd * sizeof(float) + kProbLd * sizeof(bf16)) +
           kWarps * 16 * sizeof(float);
}

template <int HS>
__global__ void __launch_bounds__(kThreads)
    attention_forward_tc_kernel(float* __restrict__ out, float* __restrict__ lse,
                                const float* __restrict__ qkv, int T, int C, int NH, float scale,
                                bool vec) {
    constexpr int kLd = kStagedLd<HS>;
    constexpr int kF = HS / 16;                  // fragments across the head
    constexpr int kW = HS < kTile ? HS : kTile;  // O columns per pass through the score buffer
    STARLING_DYNAMIC_SHARED(unsigned char, smem);
    const int warp = int(threadIdx.x) / 32;
    Carve carve{smem};
    bf16* ks = carve.take<bf16>(kTile * kLd);
    bf16* vs = carve.take<bf16>(kTile * kLd);
    float* scores = carve.take<float>(kWarps * 16 * kScoreLd) + warp * 16 * kScoreLd;
    bf16* probs = carve.take<bf16>(kWarps * 16 * kProbLd) + warp * 16 * kProbLd;
    float* inv_l = carve.take<float>(kWarps * 16) + warp * 16;  // 1 / l of the warp's rows

    const int bh = int(blockIdx.x);
    const int b = bh / NH;
    const int h = bh % NH;
    const size_t ld = 3 * size_t(C);
    const float* q_head = qkv + size_t(b) * T * ld + size_t(h) * HS;
    const int q0 = query_block_start();
    const int w0 = q0 + 16 * warp;  // the warp's first query
    const Cell e = cell();
    const int i = w0 + e.r;  // this lane's query in the elementwise steps

    // Q is staged once (through the key buffer) and then held in A fragments.
    stage<HS>(ks, q_head, ld, q0, T, vec);
    __syncthreads();
    FragA qf[kF];
    FragAcc of[kF];
#pragma unroll
    for (int kk = 0; kk < kF; kk++) {
        wmma::load_matrix_sync(qf[kk], ks + 16 * warp * kLd + 16 * kk, kLd);
        wmma::fill_fragment(of[kk], 0.0f);
    }
    // m becomes finite on the first tile, where key 0 is visible to every row (rows past T too).
    float m = -INFINITY;
    float l = 0.0f;
    const int last_key = min(T, q0 + kRows) - 1;
    for (int k0 = 0; k0 <= last_key; k0 += kTile) {
        __syncthreads();  // every warp is done with the previous tile (or with Q)
        stage<HS>(ks, q_head + C, ld, k0, T, vec);
        stage<HS>(vs, q_head + 2 * C, ld, k0, T, vec);
        __syncthreads();
        if (w0 >= T) {
            continue;  // nothing of this warp is kept; the barriers above still need it
        }
        // Key fragments holding a key at or before the warp's last row and before T: all four
        // except on the diagonal tile and at the end.
        const int nf = min(kTile / 16, (min(w0 + 15, T - 1) - k0) / 16 + 1);
        for (int f = 0; f < nf; f++) {
            FragAcc s;
            wmma::fill_fragment(s, 0.0f);
#pragma unroll
            for (int kk = 0; kk < kF; kk++) {
                FragBCol kf;  // K^T: the staged key rows read column-major
                wmma::load_matrix_sync(kf, ks + 16 * f * kLd + 16 * kk, kLd);
                wmma::mma_sync(s, qf[kk], kf, s);
            }
            wmma::store_matrix_sync(scores + 16 * f, s, kScoreLd, wmma::mem_row_major);
        }
        __syncwarp();

        // Online softmax step in fp32. Keys past T lie after every real row, so the causal mask
        // also covers the ragged end.
        const int width = 16 * nf;
        const float* srow = scores + e.r * kScoreLd;
        float tile_max = -INFINITY;
        for (int c = e.c0; c < width; c += 2) {
            tile_max = fmaxf(tile_max, k0 + c <= i ? srow[c] * scale : -INFINITY);
        }
        tile_max = fmaxf(tile_max, __shfl_xor_sync(kFullMask, tile_max, 1));
        const float m_new = fmaxf(m, tile_max);
        const float alpha = expf(m - m_new);  // 0 on the first tile; O and l are 0 there
        float sum = 0.0f;
        for (int c = e.c0; c < width; c += 2) {
            const float p = k0 + c <= i ? expf(srow[c] * scale - m_new) : 0.0f;
            sum += p;  // the unrounded p, so that lse is the fp32 log-sum-exp
            probs[e.r * kProbLd + c] = __float2bfloat16_rn(p);
        }
        sum += __shfl_xor_sync(kFullMask, sum, 1);
        l = l * alpha + sum;
        m = m_new;
        __syncwarp();  // scores read, probabilities written

        // O *= alpha row by row, only when some row's max moved (rare once the max settles).
        if (k0 > 0 && __any_sync(kFullMask, alpha != 1.0f)) {
#pragma unroll
            for (int p = 0; p < kF * 16 / kW; p++) {
#pragma unroll
                for (int n = 0; n < kW / 16; n++) {
                    wmma::store_matrix_sync(scores + 16 * n, of[p * (kW / 16) + n], kScoreLd,
                                            wmma::mem_row_major);
                }
                __syncwarp();
                scale_row(scores, kScoreLd, kW, e, alpha);
                __syncwarp();
#pragma unroll
                for (int n = 0; n < kW / 16; n++) {
                    wmma::load_matrix_sync(of[p * (kW / 16) + n], scores + 16 * n, kScoreLd,
                                           wmma::mem_row_major);
                }
                __syncwarp();  // loaded before the next pass (or tile) overwrites the buffer
            }
        }

        for (int f = 0; f < nf; f++) {
            FragA pf;
            wmma::load_matrix_sync(pf, probs + 16 * f, kProbLd);
            mma_across_head(of, pf, vs + 16 * f * kLd, kLd);
        }
        // The next tile writes probs only after the __syncthreads that starts it.
    }
    if (w0 >= T) {
        return;
    }
    if (e.c0 == 0) {
        inv_l[e.r] = 1.0f / l;
        if (i < T) {
            lse[size_t(bh) * T + i] = m + logf(l);
        }
    }
    __syncwarp();
    write_rows<HS, kW>(of, scores, kScoreLd, out + (size_t(b) * T) * C + size_t(h) * HS, size_t(C),
                       w0, T, inv_l);
}

// Both backward kernels. Own rows X, Y and streamed tiles U, W:
//   query side (kKeys false): X = Q, Y = dO, U = K, W = V; S = X U^T, dP = Y W^T, dQ = dS U.
//   key side   (kKeys true):  X = K, Y = V, U = Q, W = dO; S^T = X U^T, dP^T = Y W^T,
//                             dK = dS^T U, dV = P^T W.
// The own rows' A fragments stay in registers, except on the key side at head size 128, where
// they and the two gradients would not fit: there they are read from shared memory as needed,
// and the streamed tiles are 32 rows so that two blocks (2 x 67.25 KiB) still fit an A100 SM.
template <int HS, bool kKeys>
struct Backward {
    static constexpr bool kOwnInSmem = kKeys && HS > 64;
    static constexpr int kStream = kOwnInSmem ? 32 : kTile;  // rows of a streamed tile
    static_assert(kRows % kStream == 0, "streamed tiles start at block boundaries");
    static constexpr size_t kSmem =
        2 * tile_bytes<HS>(kStream) + (kOwnInSmem ? 2 * tile_bytes<HS>() : 0) +
        kWarps * 16 * (2 * kChunkLd * sizeof(float) + 2 * kChunkLdH * sizeof(bf16)) +
        2 * kStream * sizeof(float);
};

template <int HS, bool kKeys>
__global__ void __launch_bounds__(kThreads)
    attention_backward_tc_kernel(float* __restrict__ dqkv, float* __restrict__ D,
                                 const float* __restrict__ dout, const float* __restrict__ qkv,
                                 const float* __restrict__ out, const float* __restrict__ lse,
                                 int T, int C, int NH, float scale, bool vec) {
    constexpr int kLd = kStagedLd<HS>;
    constexpr int kF = HS / 16;
    constexpr bool kOwnInSmem = Backward<HS, kKeys>::kOwnInSmem;
    constexpr int kStream = Backward<HS, kKeys>::kStream;
    STARLING_DYNAMIC_SHARED(unsigned char, smem);
    const int warp = int(threadIdx.x) / 32;
    Carve carve{smem};
    bf16* us = carve.take<bf16>(kStream * kLd);
    bf16* ws = carve.take<bf16>(kStream * kLd);
    // Own rows: their own buffers when read throughout, else staged through U and W once.
    bf16* xs = kOwnInSmem ? carve.take<bf16>(kRows * kLd) : us;
    bf16* ys = kOwnInSmem ? carve.take<bf16>(kRows * kLd) : ws;
    float* s_buf = carve.take<float>(kWarps * 2 * 16 * kChunkLd) + warp * 2 * 16 * kChunkLd;
    float* dp_buf = s_buf + 16 * kChunkLd;  // s_buf: S (S^T) of a chunk, fp32; dp_buf: dP (dP^T)
    bf16* p_buf = carve.take<bf16>(kWarps * 2 * 16 * kChunkLdH) + warp * 2 * 16 * kChunkLdH;
    bf16* ds_buf = p_buf + 16 * kChunkLdH;      // and P (P^T), dS (dS^T) of a chunk, bf16
    float* lse_s = carve.take<float>(kStream);  // lse and D of the staged query tile (key side)
    float* d_s = carve.take<float>(kStream);

    const int bh = int(blockIdx.x);
    const int b = bh / NH;
    const int h = bh % NH;
    const size_t ld = 3 * size_t(C);
    const size_t head = size_t(b) * T * ld + size_t(h) * HS;   // in qkv and dqkv
    const size_t head_o = size_t(b) * T * C + size_t(h) * HS;  // in out and dout
    const float* q_head = qkv + head;
    const float* k_head = q_head + C;
    const float* v_head = q_head + 2 * C;
    const float* do_head = dout + head_o;
    const int own0 = kKeys ? int(blockIdx.y) * kRows : query_block_start();
    const int w0 = own0 + 16 * warp;
    const Cell e = cell();

    stage<HS>(xs, kKeys ? k_head : q_head, ld, own0, T, vec);
    stage<HS>(ys, kKeys ? v_head : do_head, kKeys ? ld : size_t(C), own0, T, vec);

    // Query side: this lane's row's lse and D = dO . O (fp32, one warp per row), which also go to
    // D for the key-side kernel that runs next.
    float lse_row = 0.0f;
    float d_row = 0.0f;
    if constexpr (!kKeys) {
        for (int r = 0; r < 16 && w0 + r < T; r++) {  // the bound is the same for every lane
            const size_t off = head_o + size_t(w0 + r) * C;
            float acc = 0.0f;
            for (int d = e.lane; d < HS; d += 32) {
                acc = fmaf(dout[off + d], out[off + d], acc);
            }
#pragma unroll
            for (int offset = 16; offset > 0; offset /= 2) {
                acc += __shfl_xor_sync(kFullMask, acc, offset);
            }
            if (r == e.r) {
                d_row = acc;
                lse_row = lse[size_t(bh) * T + w0 + r];
            }
            if (e.lane == 0) {
                D[size_t(bh) * T + w0 + r] = acc;
            }
        }
    }
    __syncthreads();

    FragA xf[kOwnInSmem ? 1 : kF];
    FragA yf[kOwnInSmem ? 1 : kF];
    if constexpr (!kOwnInSmem) {
#pragma unroll
        for (int kk = 0; kk < kF; kk++) {
            wmma::load_matrix_sync(xf[kk], xs + 16 * warp * kLd + 16 * kk, kLd);
            wmma::load_matrix_sync(yf[kk], ys + 16 * warp * kLd + 16 * kk, kLd);
        }
    }
    FragAcc grad_u[kF];              // dQ or dK
    FragAcc grad_w[kKeys ? kF : 1];  // dV
#pragma unroll
    for (int n = 0; n < kF; n++) {
        wmma::fill_fragment(grad_u[n], 0.0f);
        if constexpr (kKeys) {
            wmma::fill_fragment(grad_w[n], 0.0f);
        }
    }

    const int begin = kKeys ? own0 : 0;
    const int end = kKeys ? T : min(T, own0 + kRows);
    for (int t0 = begin; t0 < end; t0 += kStream) {
        __syncthreads();  // every warp is done with the previous tile (or the own rows' staging)
        stage<HS, kStream>(us, kKeys ? q_head : k_head, ld, t0, T, vec);
        stage<HS, kStream>(ws, kKeys ? do_head : v_head, kKeys ? size_t(C) : ld, t0, T, vec);
        if constexpr (kKeys) {
            if (threadIdx.x < kStream) {
                const int t = t0 + int(threadIdx.x);
                lse_s[threadIdx.x] = t < T ? lse[size_t(bh) * T + t] : 0.0f;
                d_s[threadIdx.x] = t < T ? D[size_t(bh) * T + t] : 0.0f;
            }
        }
        __syncthreads();

        for (int f = 0; f < kStream / 16; f++) {
            const int c0 = t0 + 16 * f;  // the chunk's first streamed row
            // Skip chunks the mask hides from all 16 rows of the warp, and chunks past T.
            if (c0 >= T || (kKeys ? c0 + 15 < w0 : (c0 > w0 + 15 || w0 >= T))) {
                continue;
            }
            const bf16* uc = us + 16 * f * kLd;
            const bf16* wc = ws + 16 * f * kLd;
            FragAcc s;
            FragAcc dp;
            wmma::fill_fragment(s, 0.0f);
            wmma::fill_fragment(dp, 0.0f);
#pragma unroll
            for (int kk = 0; kk < kF; kk++) {
                FragBCol bf;  // U^T, then W^T: staged rows read column-major
                wmma::load_matrix_sync(bf, uc + 16 * kk, kLd);
                if constexpr (kOwnInSmem) {
                    FragA af;
                    wmma::load_matrix_sync(af, xs + 16 * warp * kLd + 16 * kk, kLd);
                    wmma::mma_sync(s, af, bf, s);
                    wmma::load_matrix_sync(bf, wc + 16 * kk, kLd);
                    wmma::load_matrix_sync(af, ys + 16 * warp * kLd + 16 * kk, kLd);
                    wmma::mma_sync(dp, af, bf, dp);
                } else {
                    wmma::mma_sync(s, xf[kk], bf, s);
                    wmma::load_matrix_sync(bf, wc + 16 * kk, kLd);
                    wmma::mma_sync(dp, yf[kk], bf, dp);
                }
            }
            wmma::store_matrix_sync(s_buf, s, kChunkLd, wmma::mem_row_major);
            wmma::store_matrix_sync(dp_buf, dp, kChunkLd, wmma::mem_row_major);
            __syncwarp();

            // P = exp(S * scale - lse) where the key is at or before the query and the query
            // before T, else 0; dS = P (dP - D) * scale. Rounded to bf16 for the products.
#pragma unroll
            for (int n = 0; n < 8; n++) {
                const int c = 2 * n + e.c0;
                const int own = w0 + e.r;
                const int other = c0 + c;
                const int query = kKeys ? other : own;
                const int key = kKeys ? own : other;
                const float lse_q = kKeys ? lse_s[16 * f + c] : lse_row;
                const float d_q = kKeys ? d_s[16 * f + c] : d_row;
                const float p = key <= query && query < T
                                    ? expf(s_buf[e.r * kChunkLd + c] * scale - lse_q)
                                    : 0.0f;
                const float ds = p * (dp_buf[e.r * kChunkLd + c] - d_q) * scale;
                if constexpr (kKeys) {
                    p_buf[e.r * kChunkLdH + c] = __float2bfloat16_rn(p);
                }
                ds_buf[e.r * kChunkLdH + c] = __float2bfloat16_rn(ds);
            }
            __syncwarp();

            FragA af;
            wmma::load_matrix_sync(af, ds_buf, kChunkLdH);
            mma_across_head(grad_u, af, uc, kLd);
            if constexpr (kKeys) {
                wmma::load_matrix_sync(af, p_buf, kChunkLdH);
                mma_across_head(grad_w, af, wc, kLd);
            }
            // The next chunk rewrites p_buf and ds_buf only after its own __syncwarp.
        }
    }
    float* grad_head = dqkv + head + (kKeys ? C : 0);
    write_rows<HS, 16>(grad_u, s_buf, kChunkLd, grad_head, ld, w0, T, nullptr);
    if constexpr (kKeys) {
        write_rows<HS, 16>(grad_w, s_buf, kChunkLd, grad_head + C, ld, w0, T, nullptr);
    }
}

// The head size when the tensor-core kernels take the shape, else 0 (the fp32 kernels take it,
// or throw for a shape no kernel can take). Throws for grids beyond the hardware's limits.
int tc_head_size(const char* op, int B, int T, int C, int NH) {
    if (B < 0 || T < 0 || NH <= 0 || C <= 0 || C % NH != 0) {
        return 0;
    }
    const int hs = C / NH;
    if (hs != 16 && hs != 32 && hs != 64 && hs != 128) {
        return 0;
    }
    const std::string name(op);
    if (int64_t(B) * NH > INT_MAX) {
        throw Error(name + ": B * NH = " + std::to_string(int64_t(B) * NH) +
                    " exceeds the grid's x limit");
    }
    if ((T + kRows - 1) / kRows > kMaxGridY) {
        throw Error(name + ": T = " + std::to_string(T) + " needs more than " +
                    std::to_string(kMaxGridY) + " row blocks");
    }
    return hs;
}

template <typename Fn>
void with_head_size(int hs, Fn&& fn) {
    switch (hs) {
        case 16: fn(std::integral_constant<int, 16>{}); break;
        case 32: fn(std::integral_constant<int, 32>{}); break;
        case 64: fn(std::integral_constant<int, 64>{}); break;
        default: fn(std::integral_constant<int, 128>{}); break;
    }
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// Dynamic shared memory (up to 67.25 KiB, at head size 128) beyond the default 48 KiB must be
// allowed per kernel; setting it on every launch keeps this right on any device.
template <auto Kernel, typename... A>
void launch_tiles(int B, int T, int NH, size_t smem, cudaStream_t stream, A... args) {
    STARLING_CUDA_CHECK(
        cudaFuncSetAttribute(Kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    const dim3 grid(unsigned(B * NH), unsigned((T + kRows - 1) / kRows));
    launch<Kernel>(grid, kThreads, smem, stream, args...);
    STARLING_CUDA_CHECK(cudaGetLastError());
}

float softmax_scale(int hs) {
    return float(1.0 / std::sqrt(double(hs)));  // as the CPU computes it
}

}  // namespace

void attention_forward_bf16(float* out, float* lse, const float* qkv, int B, int T, int C, int NH,
                            cudaStream_t stream) {
    const int hs = tc_head_size("attention_forward_bf16", B, T, C, NH);
    if (hs == 0) {
        attention_forward(out, lse, qkv, B, T, C, NH, stream);  // fp32 fallback
        return;
    }
    if (B == 0 || T == 0) {
        return;
    }
    with_head_size(hs, [&](auto size) {
        constexpr int HS = decltype(size)::value;
        launch_tiles<attention_forward_tc_kernel<HS>>(B, T, NH, forward_smem<HS>(), stream, out,
                                                      lse, qkv, T, C, NH, softmax_scale(hs),
                                                      aligned16(qkv));
    });
}

void attention_backward_bf16(float* dqkv, const float* dout, const float* qkv, const float* out,
                             const float* lse, float* scratch, int B, int T, int C, int NH,
                             cudaStream_t stream) {
    const int hs = tc_head_size("attention_backward_bf16", B, T, C, NH);
    if (hs == 0) {
        attention_backward(dqkv, dout, qkv, out, lse, scratch, B, T, C, NH, stream);  // fp32
        return;
    }
    if (B == 0 || T == 0) {
        return;
    }
    const bool vec = aligned16(qkv) && aligned16(dout);
    with_head_size(hs, [&](auto size) {
        constexpr int HS = decltype(size)::value;
        // The query side first: it writes D (scratch), which the key side reads.
        launch_tiles<attention_backward_tc_kernel<HS, false>>(
            B, T, NH, Backward<HS, false>::kSmem, stream, dqkv, scratch, dout, qkv, out, lse, T, C,
            NH, softmax_scale(hs), vec);
        launch_tiles<attention_backward_tc_kernel<HS, true>>(B, T, NH, Backward<HS, true>::kSmem,
                                                             stream, dqkv, scratch, dout, qkv, out,
                                                             lse, T, C, NH, softmax_scale(hs), vec);
    });
}

}  // namespace starling::cuda
