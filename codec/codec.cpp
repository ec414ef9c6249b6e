// Element codecs (codec.h). Byte layout and rounding are described in README.md, "Element codecs".
//
// Every codec works block by block (64 values; the rounding bits, 16 per element, come from Philox
// in windows of 64 elements aligned to the global index, 8 calls per window), and no block depends
// on another, so the output is the same whatever the thread count and whichever range of whole
// blocks is encoded. Large ranges run in parallel; no exception is thrown inside a parallel region:
// bad blocks are reported by index and the error raised afterwards. The AVX2 paths do exactly the
// arithmetic of the scalar helpers in common/stochastic_rounding.h (the scalar paths serve short
// blocks and builds without AVX2).
#include "codec/codec.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <limits>
#include <string>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define STARLING_CODEC_AVX2 1
#else
#define STARLING_CODEC_AVX2 0
#endif

#include "codec/block_layout.h"
#include "codec/parallel_coding.h"
#include "common/error.h"
#include "common/random.h"
#include "common/stochastic_rounding.h"
#include "common/rounding_noise.h"

namespace starling::codec {

static_assert(std::endian::native == std::endian::little,
              "the wire format is little-endian and is copied as is");

namespace {

using layout::kScaleBytes;
using layout::num_blocks;
constexpr size_t kNone = std::numeric_limits<size_t>::max();
constexpr uint32_t kAbsMask = 0x7fffffffu;
constexpr uint32_t kInfBits = 0x7f800000u;

// The block codecs' largest level (layout::kQ8Max or kQ4Max).
constexpr int qmax_of(Codec c) { return c == Codec::Q8 ? layout::kQ8Max : layout::kQ4Max; }

// Bytes of one whole block, scale included: where block b starts is b times this.
size_t full_block_bytes(Codec c) { return layout::block_bytes(qmax_of(c)); }

std::string name_of(Codec c) { return std::string(codec_name(c)); }

Error not_element_codec(Codec c) {
    return Error(c == Codec::TOPK ? "TOPK is coded with its format (codec/sparse.h)"
                                  : "unknown codec " + std::to_string(int(c)));
}

// Runs ok = body(b) for every block b of a range of n elements, in parallel for large ranges.
// Returns the first block whose body returned false, or kNone. The serial path stops there; the
// parallel one finishes its blocks (the caller throws either way).
template <typename Body>
size_t for_each_block(size_t nblocks, size_t n, const Body& body) {
    size_t first_bad = kNone;
    if (code_in_parallel(n)) {
        const ptrdiff_t count = static_cast<ptrdiff_t>(nblocks);
#pragma omp parallel for schedule(static) reduction(min : first_bad)
        for (ptrdiff_t b = 0; b < count; b++) {
            if (!body(static_cast<size_t>(b)) && static_cast<size_t>(b) < first_bad) {
                first_bad = static_cast<size_t>(b);
            }
        }
    } else {
        for (size_t b = 0; b < nblocks; b++) {
            if (!body(b)) {
                return b;
            }
        }
    }
    return first_bad;
}

// ---------------------------------------------------------------------------------------------
// Rounding bits: the 16 bits of each of the elements 64w .. 64w+63 (window w), 8 Philox calls of
// four words; word k of a window holds the bits of element 2k (low half) and 2k+1 (high half), so
// the window's 32 words stored little-endian are the 64 elements' bits as u16s in element order.

class WordGen {
public:
    // first_window: where the range starts (it only picks which constants are precomputed).
    WordGen(const RoundingKey& key, uint64_t first_window)
        : s_(philox_stream(key.node_id, key.round, key.stream)) {
#if STARLING_CODEC_AVX2
        for (int r = 0; r < 10; r++) {
            k0_[r] = broadcast(s_.key0 + uint32_t(r) * 0x9E3779B9u);
            k1_[r] = broadcast(s_.key1 + uint32_t(r) * 0xBB67AE85u);
        }
        cached_ = folded(group_hi(first_window));
#else
        (void)first_window;
#endif
    }

    // The bits of elements 64w .. 64w+63 (bits is 32-byte aligned).
    void window(uint64_t w, uint16_t* bits) const {
#if STARLING_CODEC_AVX2
        const uint32_t ghi = group_hi(w);
        if (ghi == cached_.ghi) [[likely]] {
            window_avx2(uint32_t(w * 8), cached_, bits);
        } else {
            window_avx2(uint32_t(w * 8), folded(ghi), bits);
        }
#else
        for (uint64_t g = 0; g < 8; g++) {
            const Philox4x32 r = rounding_words(s_, w * 8 + g);
            for (int k = 0; k < 4; k++) {
                bits[8 * g + 2 * k] = uint16_t(r.v[k]);
                bits[8 * g + 2 * k + 1] = uint16_t(r.v[k] >> 16);
            }
        }
#endif
    }

    // The bits of one element (for ranges that do not start on a window).
    uint32_t bits(uint64_t index) const { return rounding_bits(s_, index); }

private:
    PhiloxStream s_;

#if STARLING_CODEC_AVX2
    static constexpr uint32_t kM0 = 0xD2511F53u;
    static constexpr uint32_t kM1 = 0xCD9E8D57u;
    static constexpr uint32_t kW0 = 0x9E3779B9u;
    static constexpr uint32_t kW1 = 0xBB67AE85u;

    // Eight copies of a word, read as a memory operand (a register would have to be spilled).
    struct alignas(32) Broadcast {
        uint32_t v[8];
        __m256i get() const { return _mm256_load_si256(reinterpret_cast<const __m256i*>(v)); }
    };

    static Broadcast broadcast(uint32_t x) {
        Broadcast b;
        std::fill(b.v, b.v + 8, x);
        return b;
    }

    static uint32_t group_hi(uint64_t w) { return uint32_t((w * 8) >> 32); }

    // Rounds 1 to 3 over a window: only the counter's last word (the group) varies, so most of
    // their arithmetic is constant and done here, once per high half of the group index.
    //  Round 1: c0 = A, c1 = B, c2 = C ^ group, c3 = D (products of constant words).
    //  Round 2: M0 * A is constant: c0 = hi(M1 c2) ^ B ^ k0, c1 = lo(M1 c2), c2 = G, c3 = F.
    //  Round 3: M1 * G is constant: c0 = H ^ c1 ^ k0, c1 = I, c2 = hi(M0 c0) ^ F ^ k1,
    //           c3 = lo(M0 c0).
    struct Folded {
        uint32_t ghi;
        Broadcast c, bk, hk, fk, i;
    };

    Folded folded(uint32_t ghi) const {
        const uint32_t k00 = s_.key0, k10 = s_.key1;
        const uint32_t k01 = k00 + kW0, k11 = k10 + kW1, k02 = k01 + kW0, k12 = k11 + kW1;
        uint32_t hi0, lo0, hi1, lo1;
        philox_mulhilo(kM0, s_.round_lo, hi0, lo0);
        philox_mulhilo(kM1, s_.stream, hi1, lo1);
        const uint32_t A = hi1 ^ (s_.round_hi ^ ghi) ^ k00, B = lo1, C = hi0 ^ k10, D = lo0;
        uint32_t E, F, H, I;
        philox_mulhilo(kM0, A, E, F);
        const uint32_t G = E ^ D ^ k11;
        philox_mulhilo(kM1, G, H, I);
        return Folded{
            ghi,         broadcast(C), broadcast(B ^ k01), broadcast(H ^ k02), broadcast(F ^ k12),
            broadcast(I)};
    }

    // Four Philox counters per register, one per 64-bit lane, each word in the low half of its lane
    // (the high half is don't-care: _mm256_mul_epu32 reads only the low halves). Register j holds
    // the groups 4j, 4j+2, 4j+1, 4j+3, an order that the final unpack turns into element order.
    void window_avx2(uint32_t glo, const Folded& f, uint16_t* bits) const {
        constexpr int kRegs = 2;  // 8 groups
        const __m256i m0 = m0_.get();
        const __m256i m1 = m1_.get();
        const __m256i base = _mm256_set1_epi32(int(glo));
        __m256i c0[kRegs], c1[kRegs], c2[kRegs], c3[kRegs];
        for (int j = 0; j < kRegs; j++) {
            const __m256i lane = _mm256_setr_epi64x(4 * j + 0, 4 * j + 2, 4 * j + 1, 4 * j + 3);
            const __m256i c2r1 = _mm256_xor_si256(f.c.get(), _mm256_add_epi32(base, lane));
            const __m256i p1 = _mm256_mul_epu32(c2r1, m1);  // round 2
            const __m256i c0r2 = _mm256_xor_si256(_mm256_srli_epi64(p1, 32), f.bk.get());
            const __m256i p0 = _mm256_mul_epu32(c0r2, m0);  // round 3
            c0[j] = _mm256_xor_si256(p1, f.hk.get());
            c1[j] = f.i.get();
            c2[j] = _mm256_xor_si256(_mm256_srli_epi64(p0, 32), f.fk.get());
            c3[j] = p0;
        }
        for (int r = 3; r < 10; r++) {
            for (int j = 0; j < kRegs; j++) {
                const __m256i p0 = _mm256_mul_epu32(c0[j], m0);
                const __m256i p1 = _mm256_mul_epu32(c2[j], m1);
                c0[j] = _mm256_xor_si256(_mm256_xor_si256(_mm256_srli_epi64(p1, 32), c1[j]),
                                         k0_[r].get());
                c2[j] = _mm256_xor_si256(_mm256_xor_si256(_mm256_srli_epi64(p0, 32), c3[j]),
                                         k1_[r].get());
                c1[j] = p1;
                c3[j] = p0;
            }
        }
        for (int j = 0; j < kRegs; j++) {
            const __m256i r01 = _mm256_blend_epi32(c0[j], _mm256_slli_epi64(c1[j], 32), 0xAA);
            const __m256i r23 = _mm256_blend_epi32(c2[j], _mm256_slli_epi64(c3[j], 32), 0xAA);
            _mm256_store_si256(reinterpret_cast<__m256i*>(bits + 32 * j),
                               _mm256_unpacklo_epi64(r01, r23));
            _mm256_store_si256(reinterpret_cast<__m256i*>(bits + 32 * j + 16),
                               _mm256_unpackhi_epi64(r01, r23));
        }
    }

    Broadcast m0_ = broadcast(kM0);
    Broadcast m1_ = broadcast(kM1);
    Broadcast k0_[10];  // round keys
    Broadcast k1_[10];
    Folded cached_;  // for the high half of the first window's group index
#endif
};

// ---------------------------------------------------------------------------------------------
// Q8 / Q4 blocks: fp32 scale, then the payload. QMAX is 127 (one int8 per value) or 7 (two
// two's-complement nibbles per byte, low nibble first).

template <int QMAX>
void store_q(int8_t* q, size_t len, std::byte* payload) {
    if constexpr (QMAX == layout::kQ8Max) {
        std::memcpy(payload, q, len);
    } else {
        for (size_t i = 0; i < len; i += 2) {
            const uint8_t lo = uint8_t(q[i]) & 0x0F;
            const uint8_t hi = i + 1 < len ? uint8_t(uint8_t(q[i + 1]) & 0x0F) : uint8_t(0);
            payload[i / 2] = std::byte(uint8_t(lo | (hi << 4)));
        }
    }
}

// Encodes a block of len <= 64 values x = delta (+ residual with feedback, which is then updated),
// whose rounding bits are window w of gen. Returns false, writing nothing, if the block holds a
// NaN or Inf.
template <int QMAX, bool FEEDBACK>
bool encode_block_scalar(const float* delta, float* residual, size_t len, const WordGen& gen,
                         uint64_t w, std::byte* out) {
    float x[kBlock];
    uint32_t max_bits = 0;
    for (size_t i = 0; i < len; i++) {
        x[i] = FEEDBACK ? delta[i] + residual[i] : delta[i];
        max_bits = std::max(max_bits, std::bit_cast<uint32_t>(x[i]) & kAbsMask);
    }
    if (max_bits >= kInfBits) {
        return false;
    }
    const QuantBlock qb = quant_block(std::bit_cast<float>(max_bits), float(QMAX));
    alignas(32) uint16_t bits[kBlock];
    gen.window(w, bits);
    int8_t q[kBlock];
    for (size_t i = 0; i < len; i++) {
        q[i] = int8_t(quantize_sr(x[i], qb, bits[i], QMAX));
        if constexpr (FEEDBACK) {
            residual[i] = x[i] - mul_rn(float(q[i]), qb.scale);
        }
    }
    std::memcpy(out, &qb.scale, kScaleBytes);
    store_q<QMAX>(q, len, out + kScaleBytes);
    return true;
}

#if STARLING_CODEC_AVX2
// Encoding is arithmetic-bound, and left alone the core waits on memory between bursts of
// Philox: fetch a few blocks ahead.
constexpr size_t kPrefetchAhead = 4 * kBlock;

inline void prefetch_block(const float* p) {
    for (size_t line = 0; line < kBlock * sizeof(float); line += 64) {
        _mm_prefetch(reinterpret_cast<const char*>(p) + line, _MM_HINT_T0);
    }
}

// Keeps a product from being contracted into a following subtraction (see mul_rn).
inline __m256 opaque(__m256 v) {
    __asm__("" : "+x"(v));
    return v;
}

inline uint32_t hmax_epu32(__m256i v) {
    __m128i m = _mm_max_epu32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    m = _mm_max_epu32(m, _mm_shuffle_epi32(m, 0x4E));
    m = _mm_max_epu32(m, _mm_shuffle_epi32(m, 0xB1));
    return uint32_t(_mm_cvtsi128_si32(m));
}

// The whole-block case of encode_block_scalar, 8 values per instruction. The block is loaded and
// its scale worked out before its rounding bits are drawn, so memory latency and the divisions
// overlap with Philox's arithmetic.
template <int QMAX, bool FEEDBACK>
bool encode_block_avx2(const float* delta, float* residual, const WordGen& gen, uint64_t w,
                       std::byte* out) {
    // x is read again after Philox (from L1) rather than held in registers, which Philox needs.
    alignas(32) float sum[FEEDBACK ? kBlock : 1];
    const float* x = FEEDBACK ? sum : delta;
    __m256i max_bits = _mm256_setzero_si256();
    const __m256i abs_mask = _mm256_set1_epi32(int(kAbsMask));
    for (int k = 0; k < 8; k++) {
        __m256 xk = _mm256_loadu_ps(delta + 8 * k);
        if constexpr (FEEDBACK) {
            xk = _mm256_add_ps(xk, _mm256_loadu_ps(residual + 8 * k));
            _mm256_store_ps(sum + 8 * k, xk);
        }
        max_bits = _mm256_max_epu32(max_bits, _mm256_and_si256(_mm256_castps_si256(xk), abs_mask));
    }
    const uint32_t m = hmax_epu32(max_bits);
    if (m >= kInfBits) {
        return false;
    }
    const QuantBlock qb = quant_block(std::bit_cast<float>(m), float(QMAX));
    const bool tiny = qb.pre != 1.0f;  // x * pre first (exact); x * 1 would be x
    alignas(32) uint16_t bits[kBlock];
    gen.window(w, bits);
    const __m256 inv16 = _mm256_set1_ps(qb.inv16);
    __m256i q[8];
    for (int k = 0; k < 8; k++) {
        const __m256i rv =
            _mm256_cvtepu16_epi32(_mm_load_si128(reinterpret_cast<const __m128i*>(bits + 8 * k)));
        const __m256 xk = tiny ? _mm256_mul_ps(_mm256_loadu_ps(x + 8 * k), _mm256_set1_ps(qb.pre))
                               : _mm256_loadu_ps(x + 8 * k);
        // cvtps rounds to nearest even, as round_to_int does (the default MXCSR mode). The
        // floor lies in [-qmax - 1, qmax + 1], clamped once packed to bytes.
        q[k] = _mm256_srai_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(xk, inv16)), rv),
                                 16);
    }
    // int32 -> int8 in element order: the packs interleave 128-bit lanes, the permute undoes it.
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    const __m256i lo = _mm256_set1_epi8(-QMAX);
    const __m256i hi = _mm256_set1_epi8(QMAX);
    __m256i bytes[2];
    for (int h = 0; h < 2; h++) {
        const __m256i a = _mm256_packs_epi32(q[4 * h], q[4 * h + 1]);
        const __m256i b = _mm256_packs_epi32(q[4 * h + 2], q[4 * h + 3]);
        bytes[h] = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(a, b), order);
        bytes[h] = _mm256_max_epi8(bytes[h], lo);
        if constexpr (QMAX != layout::kQ8Max) {  // 128 already saturated to 127
            bytes[h] = _mm256_min_epi8(bytes[h], hi);
        }
    }
    if constexpr (FEEDBACK) {
        const __m256 scale = _mm256_set1_ps(qb.scale);
        for (int k = 0; k < 8; k++) {
            const __m128i eight = _mm_loadl_epi64(
                reinterpret_cast<const __m128i*>(reinterpret_cast<const int8_t*>(bytes) + 8 * k));
            const __m256 qf = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(eight));
            _mm256_storeu_ps(residual + 8 * k, _mm256_sub_ps(_mm256_load_ps(x + 8 * k),
                                                             opaque(_mm256_mul_ps(qf, scale))));
        }
    }
    std::memcpy(out, &qb.scale, kScaleBytes);
    std::byte* payload = out + kScaleBytes;
    if constexpr (QMAX == layout::kQ8Max) {
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(payload), bytes[0]);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(payload + 32), bytes[1]);
    } else {
        // Byte pairs (e0, e1) as 16-bit words: (e0 & 15) | (e1 & 15) << 4 in the low byte.
        const __m256i nib = _mm256_set1_epi8(0x0F);
        const __m256i low_byte = _mm256_set1_epi16(0x00FF);
        __m256i packed[2];
        for (int h = 0; h < 2; h++) {
            const __m256i t = _mm256_and_si256(bytes[h], nib);
            packed[h] = _mm256_and_si256(_mm256_or_si256(t, _mm256_srli_epi16(t, 4)), low_byte);
        }
        const __m256i all =
            _mm256_permute4x64_epi64(_mm256_packus_epi16(packed[0], packed[1]), 0xD8);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(payload), all);
    }
    return true;
}
#endif

template <int QMAX, bool FEEDBACK>
void encode_blocks(Codec c, const float* delta, float* residual, size_t n, uint64_t first_index,
                   const RoundingKey& key, std::byte* out) {
    if (first_index % kBlock != 0) {
        throw Error(name_of(c) + " encode: first_index " + std::to_string(first_index) +
                    " is not a multiple of the block size " + std::to_string(kBlock));
    }
    const uint64_t first_window = first_index / kBlock;
    const WordGen gen(key, first_window);
    const size_t block_bytes = full_block_bytes(c);
    const size_t bad = for_each_block(num_blocks(n), n, [&](size_t b) {
        const size_t start = b * kBlock;
        const size_t len = std::min(kBlock, n - start);
        float* r = FEEDBACK ? residual + start : nullptr;
        std::byte* o = out + b * block_bytes;
#if STARLING_CODEC_AVX2
        if (start + kPrefetchAhead + kBlock <= n) {
            prefetch_block(delta + start + kPrefetchAhead);
            if constexpr (FEEDBACK) {
                prefetch_block(residual + start + kPrefetchAhead);
            }
        }
        if (len == kBlock) {
            return encode_block_avx2<QMAX, FEEDBACK>(delta + start, r, gen, first_window + b, o);
        }
#endif
        return encode_block_scalar<QMAX, FEEDBACK>(delta + start, r, len, gen, first_window + b, o);
    });
    if (bad != kNone) {
        const size_t start = bad * kBlock;
        throw Error(name_of(c) + " encode: block " + std::to_string(bad) + " (elements " +
                    std::to_string(first_index + start) + " to " +
                    std::to_string(first_index + std::min(n, start + kBlock) - 1) +
                    ") holds a NaN or Inf" + (FEEDBACK ? " (delta plus residual)" : ""));
    }
}

// Decodes a block of len values; false, writing nothing, if its scale is NaN, Inf or negative or
// it holds the unused level -128 (Q8) or -8 (Q4), or a non-zero padding nibble (Q4, odd len).
template <int QMAX>
bool decode_block_scalar(const std::byte* in, size_t len, float* out) {
    float s;
    std::memcpy(&s, in, kScaleBytes);
    if (!(s >= 0.0f && s <= std::numeric_limits<float>::max())) {
        return false;
    }
    const auto* p = reinterpret_cast<const uint8_t*>(in + kScaleBytes);
    int8_t q[kBlock];
    if constexpr (QMAX == layout::kQ8Max) {
        for (size_t i = 0; i < len; i++) {
            q[i] = int8_t(p[i]);
        }
    } else {
        for (size_t i = 0; i < len; i++) {
            const int nib = (p[i / 2] >> (4 * (i % 2))) & 0x0F;
            q[i] = int8_t(nib >= 8 ? nib - 16 : nib);
        }
        if (len % 2 == 1 && (p[len / 2] >> 4) != 0) {
            return false;
        }
    }
    for (size_t i = 0; i < len; i++) {
        if (q[i] < -QMAX) {
            return false;
        }
    }
    for (size_t i = 0; i < len; i++) {
        out[i] = float(q[i]) * s;
    }
    return true;
}

#if STARLING_CODEC_AVX2
template <int QMAX>
bool decode_block_avx2(const std::byte* in, float* out) {
    float s;
    std::memcpy(&s, in, kScaleBytes);
    if (!(s >= 0.0f && s <= std::numeric_limits<float>::max())) {
        return false;
    }
    const auto* p = reinterpret_cast<const uint8_t*>(in + kScaleBytes);
    const __m256 scale = _mm256_set1_ps(s);
    const __m256i invalid = _mm256_set1_epi8(int8_t(0x80));
    if constexpr (QMAX == layout::kQ8Max) {
        const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
        const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 32));
        const __m256i bad =
            _mm256_or_si256(_mm256_cmpeq_epi8(a, invalid), _mm256_cmpeq_epi8(b, invalid));
        if (!_mm256_testz_si256(bad, bad)) {
            return false;
        }
        for (int k = 0; k < 8; k++) {
            const __m128i eight = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + 8 * k));
            const __m256 v = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(eight));
            _mm256_storeu_ps(out + 8 * k, _mm256_mul_ps(v, scale));
        }
    } else {
        // Each nibble moved to the top of a byte (value * 16 as int8), interleaved low first.
        const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
        const __m256i top = _mm256_set1_epi8(int8_t(0xF0));
        const __m256i lo = _mm256_and_si256(_mm256_slli_epi16(b, 4), top);
        const __m256i hi = _mm256_and_si256(b, top);
        const __m256i bad =
            _mm256_or_si256(_mm256_cmpeq_epi8(lo, invalid), _mm256_cmpeq_epi8(hi, invalid));
        if (!_mm256_testz_si256(bad, bad)) {
            return false;
        }
        const __m256i e0 = _mm256_unpacklo_epi8(lo, hi);  // elements 0-15 | 32-47
        const __m256i e1 = _mm256_unpackhi_epi8(lo, hi);  // elements 16-31 | 48-63
        const __m128i sixteen[4] = {_mm256_castsi256_si128(e0), _mm256_castsi256_si128(e1),
                                    _mm256_extracti128_si256(e0, 1),
                                    _mm256_extracti128_si256(e1, 1)};
        for (int k = 0; k < 4; k++) {
            const __m256i v0 = _mm256_srai_epi32(_mm256_cvtepi8_epi32(sixteen[k]), 4);
            const __m256i v1 = _mm256_srai_epi32(
                _mm256_cvtepi8_epi32(_mm_unpackhi_epi64(sixteen[k], sixteen[k])), 4);
            _mm256_storeu_ps(out + 16 * k, _mm256_mul_ps(_mm256_cvtepi32_ps(v0), scale));
            _mm256_storeu_ps(out + 16 * k + 8, _mm256_mul_ps(_mm256_cvtepi32_ps(v1), scale));
        }
    }
    return true;
}
#endif

template <int QMAX>
void decode_blocks(Codec c, const std::byte* in, float* out, size_t n) {
    const size_t block_bytes = full_block_bytes(c);
    const size_t bad = for_each_block(num_blocks(n), n, [&](size_t b) {
        const size_t start = b * kBlock;
        const size_t len = std::min(kBlock, n - start);
#if STARLING_CODEC_AVX2
        if (len == kBlock) {
            return decode_block_avx2<QMAX>(in + b * block_bytes, out + start);
        }
#endif
        return decode_block_scalar<QMAX>(in + b * block_bytes, len, out + start);
    });
    if (bad == kNone) {
        return;
    }
    // Say what is wrong with the first bad block.
    const std::byte* block = in + bad * block_bytes;
    const size_t len = std::min(kBlock, n - bad * kBlock);
    const std::string where = "block " + std::to_string(bad) + " of " + name_of(c) + " data";
    float s;
    std::memcpy(&s, block, kScaleBytes);
    if (!(s >= 0.0f && s <= std::numeric_limits<float>::max())) {
        throw Error(where + " has a NaN/Inf/negative scale (" + std::to_string(s) + ")");
    }
    const auto* p = reinterpret_cast<const uint8_t*>(block + kScaleBytes);
    for (size_t i = 0; i < len; i++) {
        const int v =
            QMAX == layout::kQ8Max ? int(int8_t(p[i])) : ((p[i / 2] >> (4 * (i % 2))) & 0x0F);
        if (QMAX == layout::kQ8Max ? v == -128 : v == 8) {
            throw Error(where + " holds the level " + (QMAX == layout::kQ8Max ? "-128" : "-8") +
                        " at element " + std::to_string(i) + ", outside [-" + std::to_string(QMAX) +
                        ", " + std::to_string(QMAX) + "]");
        }
    }
    throw Error(where + " has a non-zero padding nibble after its last value");
}

// ---------------------------------------------------------------------------------------------
// BF16SR: one little-endian bf16 per value. Rounding bits are drawn by element index, so a range
// may start anywhere; it is cut at multiples of 64 of the global index ("windows").

template <bool FEEDBACK>
void bf16_span_scalar(const float* delta, float* residual, size_t len, uint64_t first,
                      const uint16_t* bits, const WordGen& gen, std::byte* out) {
    for (size_t i = 0; i < len; i++) {
        const float x = FEEDBACK ? delta[i] + residual[i] : delta[i];
        const uint32_t r = bits != nullptr ? bits[i] : gen.bits(first + i);
        const uint16_t h = bf16_round_sr(std::bit_cast<uint32_t>(x), r);
        std::memcpy(out + 2 * i, &h, 2);
        if constexpr (FEEDBACK) {
            residual[i] = x - std::bit_cast<float>(bf16_to_f32_bits(h));
        }
    }
}

#if STARLING_CODEC_AVX2
template <bool FEEDBACK>
void bf16_window_avx2(const float* delta, float* residual, const uint16_t* bits, std::byte* out) {
    const __m256i abs_mask = _mm256_set1_epi32(int(kAbsMask));
    const __m256i inf = _mm256_set1_epi32(int(kInfBits));
    const __m256i quiet = _mm256_set1_epi32(0x0040);
    for (int k = 0; k < 8; k += 2) {
        __m256i h[2];
        for (int e = 0; e < 2; e++) {
            __m256 x = _mm256_loadu_ps(delta + 8 * (k + e));
            if constexpr (FEEDBACK) {
                x = _mm256_add_ps(x, _mm256_loadu_ps(residual + 8 * (k + e)));
            }
            const __m256i xbits = _mm256_castps_si256(x);
            const __m256i r = _mm256_cvtepu16_epi32(
                _mm_load_si128(reinterpret_cast<const __m128i*>(bits + 8 * (k + e))));
            const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(xbits, r), 16);
            const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(xbits, abs_mask), inf);
            const __m256i kept = _mm256_or_si256(_mm256_srli_epi32(xbits, 16), quiet);
            h[e] = _mm256_blendv_epi8(rounded, kept, nan);
            if constexpr (FEEDBACK) {
                const __m256 back = _mm256_castsi256_ps(_mm256_slli_epi32(h[e], 16));
                _mm256_storeu_ps(residual + 8 * (k + e), _mm256_sub_ps(x, back));
            }
        }
        const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(h[0], h[1]), 0xD8);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 2 * 8 * k), packed);
    }
}
#endif

template <bool FEEDBACK>
void encode_bf16(const float* delta, float* residual, size_t n, uint64_t first_index,
                 const RoundingKey& key, std::byte* out) {
    // Head: up to the first window boundary, element by element.
    const size_t head = std::min<size_t>(n, (kBlock - first_index % kBlock) % kBlock);
    const size_t rest = n - head;
    const uint64_t first_window = (first_index + head) / kBlock;
    const WordGen gen(key, first_window);
    bf16_span_scalar<FEEDBACK>(delta, residual, head, first_index, nullptr, gen, out);
    for_each_block(num_blocks(rest), rest, [&](size_t b) {
        const size_t start = head + b * kBlock;
        const size_t len = std::min(kBlock, n - start);
        float* r = FEEDBACK ? residual + start : nullptr;
#if STARLING_CODEC_AVX2
        if (start + kPrefetchAhead + kBlock <= n) {
            prefetch_block(delta + start + kPrefetchAhead);
            if constexpr (FEEDBACK) {
                prefetch_block(residual + start + kPrefetchAhead);
            }
        }
#endif
        alignas(32) uint16_t bits[kBlock];
        gen.window(first_window + b, bits);
#if STARLING_CODEC_AVX2
        if (len == kBlock) {
            bf16_window_avx2<FEEDBACK>(delta + start, r, bits, out + 2 * start);
            return true;
        }
#endif
        bf16_span_scalar<FEEDBACK>(delta + start, r, len, 0, bits, gen, out + 2 * start);
        return true;
    });
}

void decode_bf16(const std::byte* in, float* out, size_t n) {
    for_each_block(num_blocks(n), n, [&](size_t b) {
        const size_t start = b * kBlock;
        const size_t len = std::min(kBlock, n - start);
        const std::byte* p = in + 2 * start;
        float* o = out + start;
        size_t i = 0;
#if STARLING_CODEC_AVX2
        for (; i + 8 <= len; i += 8) {
            const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 2 * i));
            _mm256_storeu_si256(reinterpret_cast<__m256i*>(o + i),
                                _mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
        }
#endif
        for (; i < len; i++) {
            uint16_t h;
            std::memcpy(&h, p + 2 * i, 2);
            o[i] = std::bit_cast<float>(bf16_to_f32_bits(h));
        }
        return true;
    });
}

// ---------------------------------------------------------------------------------------------
// F32: the bytes of the floats.

template <bool FEEDBACK>
void encode_f32(const float* delta, float* residual, size_t n, std::byte* out) {
    for_each_block(num_blocks(n), n, [&](size_t b) {
        const size_t start = b * kBlock;
        const size_t len = std::min(kBlock, n - start);
        if constexpr (FEEDBACK) {
            float x[kBlock];
            for (size_t i = 0; i < len; i++) {
                x[i] = delta[start + i] + residual[start + i];
                residual[start + i] = x[i] - x[i];
            }
            std::memcpy(out + 4 * start, x, 4 * len);
        } else {
            std::memcpy(out + 4 * start, delta + start, 4 * len);
        }
        return true;
    });
}

void decode_f32(const std::byte* in, float* out, size_t n) {
    for_each_block(num_blocks(n), n, [&](size_t b) {
        const size_t start = b * kBlock;
        std::memcpy(out + start, in + 4 * start, 4 * std::min(kBlock, n - start));
        return true;
    });
}

void check_out_size(Codec c, size_t n, size_t bytes) {
    const size_t expected = encoded_bytes(c, n);
    if (bytes != expected) {
        throw Error(name_of(c) + " encode: output of " + std::to_string(bytes) + " bytes for " +
                    std::to_string(n) + " values, which take " + std::to_string(expected));
    }
}

template <bool FEEDBACK>
void encode_any(Codec c, const float* delta, float* residual, size_t n, uint64_t first_index,
                const RoundingKey& key, std::span<std::byte> out) {
    check_out_size(c, n, out.size());
    switch (c) {
        case Codec::F32: encode_f32<FEEDBACK>(delta, residual, n, out.data()); return;
        case Codec::BF16SR:
            encode_bf16<FEEDBACK>(delta, residual, n, first_index, key, out.data());
            return;
        case Codec::Q8:
            encode_blocks<layout::kQ8Max, FEEDBACK>(c, delta, residual, n, first_index, key,
                                                    out.data());
            return;
        case Codec::Q4:
            encode_blocks<layout::kQ4Max, FEEDBACK>(c, delta, residual, n, first_index, key,
                                                    out.data());
            return;
        case Codec::TOPK: break;
    }
    throw not_element_codec(c);
}

}  // namespace

std::string_view codec_name(Codec codec) {
    switch (codec) {
        case Codec::F32: return "F32";
        case Codec::BF16SR: return "BF16SR";
        case Codec::Q8: return "Q8";
        case Codec::Q4: return "Q4";
        case Codec::TOPK: return "TOPK";
    }
    return "unknown";
}

Codec codec_from_byte(uint8_t byte) {
    if (byte > uint8_t(Codec::TOPK)) {
        throw Error("unknown codec byte " + std::to_string(byte) +
                    " (known: 0 F32, 1 BF16SR, 2 Q8, 3 Q4, 4 TOPK)");
    }
    return Codec(byte);
}

Codec codec_from_name(std::string_view name) {
    for (uint8_t b = 0; b <= uint8_t(Codec::TOPK); b++) {
        if (codec_name(Codec(b)) == name) return Codec(b);
    }
    throw Error("unknown codec \"" + std::string(name) + "\" (known: F32, BF16SR, Q8, Q4, TOPK)");
}

size_t encoded_bytes(Codec codec, size_t n) {
    // n can come off the wire: refuse counts whose size would not fit in size_t.
    const size_t limit = std::numeric_limits<size_t>::max() / 8;
    if (n > limit) {
        throw Error(name_of(codec) + ": " + std::to_string(n) + " values is too many to encode");
    }
    switch (codec) {
        case Codec::F32: return 4 * n;
        case Codec::BF16SR: return 2 * n;
        case Codec::Q8:
        case Codec::Q4: return layout::encoded_bytes(qmax_of(codec), n);
        case Codec::TOPK: break;
    }
    throw not_element_codec(codec);
}

void encode(Codec codec, std::span<const float> x, uint64_t first_index, const RoundingKey& key,
            std::span<std::byte> out) {
    encode_any<false>(codec, x.data(), nullptr, x.size(), first_index, key, out);
}

void encode_with_feedback(Codec codec, std::span<const float> delta, std::span<float> residual,
                          uint64_t first_index, const RoundingKey& key, std::span<std::byte> out) {
    if (residual.size() != delta.size()) {
        throw Error(name_of(codec) + " encode: residual of " + std::to_string(residual.size()) +
                    " values for a delta of " + std::to_string(delta.size()));
    }
    encode_any<true>(codec, delta.data(), residual.data(), delta.size(), first_index, key, out);
}

void decode(Codec codec, std::span<const std::byte> in, std::span<float> out) {
    const size_t n = out.size();
    const size_t expected = encoded_bytes(codec, n);
    if (in.size() != expected) {
        throw Error(name_of(codec) + " data of " + std::to_string(in.size()) +
                    " bytes cannot hold " + std::to_string(n) + " values, which take " +
                    std::to_string(expected) + " bytes");
    }
    switch (codec) {
        case Codec::F32: decode_f32(in.data(), out.data(), n); return;
        case Codec::BF16SR: decode_bf16(in.data(), out.data(), n); return;
        case Codec::Q8: decode_blocks<layout::kQ8Max>(codec, in.data(), out.data(), n); return;
        case Codec::Q4: decode_blocks<layout::kQ4Max>(codec, in.data(), out.data(), n); return;
        case Codec::TOPK: break;
    }
    throw not_element_codec(codec);
}

namespace {
// Below this many elements a range is done on the calling thread: waking the team costs more.
constexpr size_t kParallelMin = size_t(1) << 16;
// SerialCoding guards alive on this thread.
thread_local int serial_coding = 0;
}  // namespace

bool code_in_parallel(size_t n) { return n > kParallelMin && serial_coding == 0; }

SerialCoding::SerialCoding() { serial_coding++; }
SerialCoding::~SerialCoding() { serial_coding--; }

}  // namespace starling::codec
