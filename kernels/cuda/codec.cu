// CUDA element codecs (codec.cuh). The per-element arithmetic is the CPU's own: quant_block,
// quantize_sr, mul_rn and bf16_round_sr from kernels/math.h and the Philox bits of
// kernels/rounding.h, so the bytes match codec.cpp bit for bit.
//
// This file is compiled with --fmad=false (kernels/CMakeLists.txt): by default nvcc contracts a
// multiply followed by an add into an FMA, which rounds once where the CPU rounds twice, and the
// bytes and residuals would no longer match the CPU's. (mul_rn already keeps the residual's product
// apart; the flag covers everything else.) Division and square root stay IEEE (no
// --use_fast_math, -prec-div=true by default) and subnormals are kept (no -ftz), as on the CPU.
//
// Q8 / Q4: one warp per block of 64 values, lane l holding elements 2l and 2l+1 (one 32-bit Philox
// word: its low half is element 2l's bits, its high half element 2l+1's). The absmax is a warp
// shuffle reduction of the absolute values' bit patterns (as the CPU does: for non-negative floats
// the integer order is the float order, and a NaN or Inf shows as bits >= 0x7f800000). Each lane
// runs the Philox call of its group of eight elements, so a group's call is computed by four lanes:
// redundant arithmetic, but the kernel stays simple and memory-bound on current GPUs.
#include "kernels/cuda/codec.cuh"

#include <cuda_runtime.h>

#include <algorithm>
#include <cfloat>
#include <climits>
#include <cstring>
#include <string>
#include <vector>

#include "common/error.h"
#include "kernels/cuda/check.cuh"
#include "kernels/cuda/portable.cuh"
#include "kernels/math.h"
#include "kernels/rounding.h"

namespace starling::cuda {

namespace {

using codec::PhiloxStream;

constexpr size_t kBlock = 64;  // codec::kBlock
constexpr unsigned kFullMask = 0xffffffffu;
constexpr uint32_t kAbsMask = 0x7fffffffu;
constexpr uint32_t kInfBits = 0x7f800000u;
constexpr int kThreads = 256;  // 8 warps, 8 codec blocks at a time per thread block
constexpr int kWarpsPerCta = kThreads / 32;
constexpr unsigned long long kNoBadBlock = ULLONG_MAX;
constexpr size_t kMaxGrid = size_t(1) << 20;  // grid-stride loops cover the rest

template <int QMAX>
constexpr size_t kBlockBytes = QMAX == 127 ? 4 + kBlock : 4 + kBlock / 2;  // scale, payload

size_t num_blocks(size_t n) {
    return n / kBlock + (n % kBlock != 0 ? 1 : 0);
}

size_t payload_bytes(int qmax, size_t len) {
    return qmax == 127 ? len : (len + 1) / 2;
}

unsigned grid_for_warps(size_t warps) {
    const size_t ctas = (warps + kWarpsPerCta - 1) / kWarpsPerCta;
    return unsigned(std::min(std::max<size_t>(ctas, 1), kMaxGrid));
}

unsigned grid_for_threads(size_t threads) {
    const size_t ctas = (threads + kThreads - 1) / kThreads;
    return unsigned(std::min(std::max<size_t>(ctas, 1), kMaxGrid));
}

const char* codec_name(int qmax) {
    return qmax == 127 ? "Q8" : "Q4";
}

void check_qmax(int qmax, const char* what) {
    if (qmax != 127 && qmax != 7) {
        throw Error(std::string(what) + ": qmax " + std::to_string(qmax) +
                    " is neither 127 (Q8) nor 7 (Q4)");
    }
}

// Word k (0..3) of a Philox result without indexing the array by a runtime value (which would put
// it in local memory).
__device__ __forceinline__ uint32_t pick_word(const Philox4x32& r, unsigned k) {
    const uint32_t a = (k & 1) != 0 ? r.v[1] : r.v[0];
    const uint32_t b = (k & 1) != 0 ? r.v[3] : r.v[2];
    return (k & 2) != 0 ? b : a;
}

__device__ __forceinline__ uint32_t load_u32_le(const uint8_t* p) {
    return uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24;
}

__device__ __forceinline__ void store_u32_le(uint8_t* p, uint32_t v) {
    p[0] = uint8_t(v);
    p[1] = uint8_t(v >> 8);
    p[2] = uint8_t(v >> 16);
    p[3] = uint8_t(v >> 24);
}

// ---------------------------------------------------------------------------------------------
// The layout both Q8/Q4 kernels share: each warp takes blocks of 64 in a grid-stride loop, and
// lane l holds elements 2l and 2l+1 of the block (one Philox word's two halves).

struct WarpLanes {
    unsigned lane, i0, i1;
    size_t first_block, block_stride;
};

__device__ __forceinline__ WarpLanes warp_lanes() {
    const unsigned lane = threadIdx.x % 32;
    return {lane, 2 * lane, 2 * lane + 1, (size_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32,
            size_t(gridDim.x) * blockDim.x / 32};
}

struct LaneBlock {
    size_t start, len;  // the block's first element and its length (the last may be short)
    bool has0, has1;    // whether this lane's two elements exist
};

__device__ __forceinline__ LaneBlock lane_block(size_t b, size_t n, unsigned i0, unsigned i1) {
    const size_t start = b * kBlock;
    const size_t len = min(kBlock, n - start);
    return {start, len, i0 < len, i1 < len};
}

// ---------------------------------------------------------------------------------------------
// Q8 / Q4 encode: x = theta - phi (+ residual), one warp per block.

template <int QMAX, bool FEEDBACK>
__global__ void __launch_bounds__(kThreads)
    encode_q_kernel(uint8_t* __restrict__ out, float* __restrict__ residual,
                    const float* __restrict__ theta, const float* __restrict__ phi, size_t n,
                    size_t nblocks, uint64_t first_window, PhiloxStream ps,
                    unsigned long long* first_bad) {
    const auto [lane, i0, i1, first_block, block_stride] = warp_lanes();
    for (size_t b = first_block; b < nblocks; b += block_stride) {
        const auto [start, len, has0, has1] = lane_block(b, n, i0, i1);
        float x0 = 0.0f;
        float x1 = 0.0f;
        if (has0) {
            x0 = theta[start + i0] - phi[start + i0];
            if constexpr (FEEDBACK) {
                x0 = x0 + residual[start + i0];
            }
        }
        if (has1) {
            x1 = theta[start + i1] - phi[start + i1];
            if constexpr (FEEDBACK) {
                x1 = x1 + residual[start + i1];
            }
        }
        uint32_t max_bits = max(__float_as_uint(x0) & kAbsMask, __float_as_uint(x1) & kAbsMask);
        for (int offset = 16; offset > 0; offset /= 2) {
            max_bits = max(max_bits, __shfl_xor_sync(kFullMask, max_bits, offset));
        }
        if (max_bits >= kInfBits) {  // the same on every lane: the block is left unwritten
            if (lane == 0) {
                atomicMin(first_bad, static_cast<unsigned long long>(b));
            }
            continue;
        }
        const QuantBlock qb = quant_block(__uint_as_float(max_bits), float(QMAX));
        const uint32_t word =
            pick_word(codec::rounding_words(ps, (first_window + b) * 8 + lane / 4), lane % 4);
        const int32_t q0 = quantize_sr(x0, qb, word & 0xffffu, QMAX);
        const int32_t q1 = quantize_sr(x1, qb, word >> 16, QMAX);
        if constexpr (FEEDBACK) {
            if (has0) {
                residual[start + i0] = x0 - mul_rn(float(q0), qb.scale);
            }
            if (has1) {
                residual[start + i1] = x1 - mul_rn(float(q1), qb.scale);
            }
        }
        uint8_t* o = out + b * kBlockBytes<QMAX>;
        if (lane == 0) {
            store_u32_le(o, __float_as_uint(qb.scale));
        }
        uint8_t* payload = o + 4;
        if constexpr (QMAX == 127) {
            if (has0) {
                payload[i0] = uint8_t(int8_t(q0));
            }
            if (has1) {
                payload[i1] = uint8_t(int8_t(q1));
            }
        } else {
            if (has0) {  // an odd block leaves its last high nibble 0
                payload[lane] =
                    uint8_t((uint32_t(q0) & 0x0Fu) | (has1 ? (uint32_t(q1) & 0x0Fu) << 4 : 0u));
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Q8 / Q4 decode with the CPU's checks, one warp per block; a bad block is left unwritten.

template <int QMAX>
__global__ void __launch_bounds__(kThreads)
    decode_q_kernel(float* __restrict__ out, const uint8_t* __restrict__ in, size_t n,
                    size_t nblocks, unsigned long long* first_bad) {
    const auto [lane, i0, i1, first_block, block_stride] = warp_lanes();
    for (size_t b = first_block; b < nblocks; b += block_stride) {
        const auto [start, len, has0, has1] = lane_block(b, n, i0, i1);
        const uint8_t* block = in + b * kBlockBytes<QMAX>;
        const float s = __uint_as_float(load_u32_le(block));
        bool bad = !(s >= 0.0f && s <= FLT_MAX);
        int32_t q0 = 0;
        int32_t q1 = 0;
        if constexpr (QMAX == 127) {
            if (has0) {
                q0 = int8_t(block[4 + i0]);
            }
            if (has1) {
                q1 = int8_t(block[4 + i1]);
            }
        } else if (has0) {
            const uint32_t byte = block[4 + lane];
            const int32_t lo = int32_t(byte & 0x0Fu);
            const int32_t hi = int32_t(byte >> 4);
            q0 = lo >= 8 ? lo - 16 : lo;
            if (has1) {
                q1 = hi >= 8 ? hi - 16 : hi;
            } else if (hi != 0) {
                bad = true;  // non-zero padding nibble
            }
        }
        bad = bad || q0 < -QMAX || q1 < -QMAX;
        if (__any_sync(kFullMask, bad)) {
            if (lane == 0) {
                atomicMin(first_bad, static_cast<unsigned long long>(b));
            }
            continue;
        }
        if (has0) {
            out[start + i0] = mul_rn(float(q0), s);  // codec.cpp: float(q) * s, one rounding
        }
        if (has1) {
            out[start + i1] = mul_rn(float(q1), s);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// BF16SR: one thread per group of eight global indices (one Philox call), any first_index.

__global__ void __launch_bounds__(kThreads)
    encode_bf16sr_kernel(uint16_t* __restrict__ out, const float* __restrict__ x, size_t n,
                         uint64_t first_index, uint64_t groups, PhiloxStream ps) {
    const uint64_t first_group = first_index / 8;
    const uint64_t stride = uint64_t(gridDim.x) * blockDim.x;
    for (uint64_t t = uint64_t(blockIdx.x) * blockDim.x + threadIdx.x; t < groups; t += stride) {
        const uint64_t g = first_group + t;
        const Philox4x32 r = codec::rounding_words(ps, g);
#pragma unroll
        for (unsigned j = 0; j < 8; j++) {
            const uint64_t index = 8 * g + j;
            if (index < first_index || index - first_index >= n) {
                continue;
            }
            const size_t i = size_t(index - first_index);
            const uint32_t word = r.v[j / 2];
            const uint32_t bits = (j % 2) != 0 ? word >> 16 : word & 0xffffu;
            out[i] = bf16_round_sr(__float_as_uint(x[i]), bits);
        }
    }
}

__global__ void __launch_bounds__(kThreads)
    decode_bf16_kernel(float* __restrict__ out, const uint16_t* __restrict__ in, size_t n) {
    const size_t stride = size_t(gridDim.x) * blockDim.x;
    for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
        out[i] = __uint_as_float(bf16_to_f32_bits(in[i]));
    }
}

// ---------------------------------------------------------------------------------------------
// Host side.

// A device word holding the first bad block (kNoBadBlock when none), freed on every path.
class BadBlockFlag {
public:
    explicit BadBlockFlag(cudaStream_t stream) : stream_(stream) {
        STARLING_CUDA_CHECK(
            cudaMallocAsync(reinterpret_cast<void**>(&ptr_), sizeof(*ptr_), stream_));
        const cudaError_t status = cudaMemsetAsync(ptr_, 0xFF, sizeof(*ptr_), stream_);
        if (status != cudaSuccess) {
            (void)cudaFreeAsync(ptr_, stream_);  // the destructor will not run
            STARLING_CUDA_CHECK(status);
        }
    }
    ~BadBlockFlag() {
        (void)cudaFreeAsync(ptr_, stream_);
    }
    BadBlockFlag(const BadBlockFlag&) = delete;
    BadBlockFlag& operator=(const BadBlockFlag&) = delete;

    unsigned long long* get() const {
        return ptr_;
    }

    // Waits for the stream and returns the first bad block (kNoBadBlock when none).
    unsigned long long read() const {
        unsigned long long host = kNoBadBlock;
        STARLING_CUDA_CHECK(
            cudaMemcpyAsync(&host, ptr_, sizeof(host), cudaMemcpyDeviceToHost, stream_));
        STARLING_CUDA_CHECK(cudaStreamSynchronize(stream_));
        return host;
    }

private:
    cudaStream_t stream_;
    unsigned long long* ptr_ = nullptr;
};

PhiloxStream stream_of(uint64_t node_id, uint64_t round, uint32_t stream_id) {
    return codec::philox_stream(node_id, round, stream_id);
}

// The CPU decoder's message for a bad block, from its bytes copied back to the host.
[[noreturn]] void throw_bad_block(const std::byte* in, size_t n, int qmax, size_t bad,
                                  cudaStream_t stream) {
    const size_t full = qmax == 127 ? 4 + kBlock : 4 + kBlock / 2;
    const size_t len = std::min(kBlock, n - bad * kBlock);
    std::vector<uint8_t> block(4 + payload_bytes(qmax, len));
    STARLING_CUDA_CHECK(cudaMemcpyAsync(block.data(), in + bad * full, block.size(),
                                        cudaMemcpyDeviceToHost, stream));
    STARLING_CUDA_CHECK(cudaStreamSynchronize(stream));
    const std::string where = "block " + std::to_string(bad) + " of " + codec_name(qmax) + " data";
    float s;
    std::memcpy(&s, block.data(), 4);
    if (!(s >= 0.0f && s <= FLT_MAX)) {
        throw Error(where + " has a NaN/Inf/negative scale (" + std::to_string(s) + ")");
    }
    const uint8_t* p = block.data() + 4;
    for (size_t i = 0; i < len; i++) {
        const int v = qmax == 127 ? int(int8_t(p[i])) : ((p[i / 2] >> (4 * (i % 2))) & 0x0F);
        if (qmax == 127 ? v == -128 : v == 8) {
            throw Error(where + " holds the level " + (qmax == 127 ? "-128" : "-8") +
                        " at element " + std::to_string(i) + ", outside [-" + std::to_string(qmax) +
                        ", " + std::to_string(qmax) + "]");
        }
    }
    throw Error(where + " has a non-zero padding nibble after its last value");
}

template <int QMAX, bool FEEDBACK>
void launch_encode_q(std::byte* out, float* residual, const float* theta, const float* phi,
                     size_t n, uint64_t first_index, const PhiloxStream& ps,
                     unsigned long long* first_bad, cudaStream_t stream) {
    const size_t nblocks = num_blocks(n);
    launch<encode_q_kernel<QMAX, FEEDBACK>>(grid_for_warps(nblocks), kThreads, 0, stream,
                                            reinterpret_cast<uint8_t*>(out), residual, theta, phi,
                                            n, nblocks, first_index / kBlock, ps, first_bad);
    STARLING_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

int cuda_device_count(std::string* reason) {
    int count = 0;
    const cudaError_t status = cudaGetDeviceCount(&count);
    if (status != cudaSuccess) {
        (void)cudaGetLastError();  // not sticky: clear it so a later cudaGetLastError starts clean
        if (reason != nullptr) {
            *reason = std::string("cudaGetDeviceCount: ") + cudaGetErrorString(status);
        }
        return 0;
    }
    if (count <= 0) {
        if (reason != nullptr) {
            *reason = "no CUDA device";
        }
        return 0;
    }
    return count;
}

void encode_q8_delta(std::byte* out, float* residual, const float* theta, const float* phi,
                     size_t n, uint64_t first_index, uint64_t node_id, uint64_t round,
                     uint32_t stream_id, int qmax, cudaStream_t stream) {
    check_qmax(qmax, "encode_q8_delta");
    if (first_index % kBlock != 0) {
        throw Error(std::string(codec_name(qmax)) + " encode: first_index " +
                    std::to_string(first_index) + " is not a multiple of the block size " +
                    std::to_string(kBlock));
    }
    if (n == 0) {
        return;
    }
    const PhiloxStream ps = stream_of(node_id, round, stream_id);
    const BadBlockFlag flag(stream);
    if (qmax == 127) {
        if (residual != nullptr) {
            launch_encode_q<127, true>(out, residual, theta, phi, n, first_index, ps, flag.get(),
                                       stream);
        } else {
            launch_encode_q<127, false>(out, residual, theta, phi, n, first_index, ps, flag.get(),
                                        stream);
        }
    } else {
        if (residual != nullptr) {
            launch_encode_q<7, true>(out, residual, theta, phi, n, first_index, ps, flag.get(),
                                     stream);
        } else {
            launch_encode_q<7, false>(out, residual, theta, phi, n, first_index, ps, flag.get(),
                                      stream);
        }
    }
    const unsigned long long bad = flag.read();
    if (bad != kNoBadBlock) {
        const size_t start = size_t(bad) * kBlock;
        throw Error(std::string(codec_name(qmax)) + " encode: block " + std::to_string(bad) +
                    " (elements " + std::to_string(first_index + start) + " to " +
                    std::to_string(first_index + std::min(n, start + kBlock) - 1) +
                    ") holds a NaN or Inf" + (residual != nullptr ? " (delta plus residual)" : ""));
    }
}

void decode_q(float* out, const std::byte* in, size_t n, int qmax, cudaStream_t stream) {
    check_qmax(qmax, "decode_q");
    if (n == 0) {
        return;
    }
    const size_t nblocks = num_blocks(n);
    const BadBlockFlag flag(stream);
    const auto* bytes = reinterpret_cast<const uint8_t*>(in);
    if (qmax == 127) {
        launch<decode_q_kernel<127>>(grid_for_warps(nblocks), kThreads, 0, stream, out, bytes, n,
                                     nblocks, flag.get());
    } else {
        launch<decode_q_kernel<7>>(grid_for_warps(nblocks), kThreads, 0, stream, out, bytes, n,
                                   nblocks, flag.get());
    }
    STARLING_CUDA_CHECK(cudaGetLastError());
    const unsigned long long bad = flag.read();
    if (bad != kNoBadBlock) {
        throw_bad_block(in, n, qmax, size_t(bad), stream);
    }
}

void encode_bf16sr(uint16_t* out, const float* x, size_t n, uint64_t first_index, uint64_t node_id,
                   uint64_t round, uint32_t stream_id, cudaStream_t stream) {
    if (n == 0) {
        return;
    }
    const uint64_t groups = (first_index + n - 1) / 8 - first_index / 8 + 1;
    launch<encode_bf16sr_kernel>(grid_for_threads(groups), kThreads, 0, stream, out, x, n,
                                 first_index, groups, stream_of(node_id, round, stream_id));
    STARLING_CUDA_CHECK(cudaGetLastError());
}

void decode_bf16(float* out, const uint16_t* in, size_t n, cudaStream_t stream) {
    if (n == 0) {
        return;
    }
    launch<decode_bf16_kernel>(grid_for_threads(n), kThreads, 0, stream, out, in, n);
    STARLING_CUDA_CHECK(cudaGetLastError());
}

}  // namespace starling::cuda
