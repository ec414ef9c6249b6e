// The arithmetic of the codecs' quantization, one element at a time: written once, header-only
// and __host__ __device__, so the CPU codecs, a CUDA kernel and their tests round alike. Where the
// random bits come from is common/rounding_noise.h.
#pragma once

#include <cmath>
#include <cstdint>

#include "common/host_device.h"

namespace starling {

// fp32 multiply, rounded on its own: no compiler may fuse it with a following add (nvcc does by
// default, and so does GCC with -mfma, whose C++ default is -ffp-contract=fast), so a residual
// x - mul_rn(q, s) rounds the same way on every backend as x minus a decoded q * s.
STARLING_HD float mul_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
    return __fmul_rn(a, b);
#else
    float p = a * b;
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
    __asm__("" : "+x"(p));  // opaque to the optimizer, so the product cannot be contracted
#elif defined(__GNUC__) && defined(__aarch64__)
    __asm__("" : "+w"(p));
#else
    volatile float opaque = p;
    p = opaque;
#endif
    return p;
#endif
}

// Round to the nearest integer, ties to even (the default rounding mode on the CPU).
STARLING_HD int32_t round_to_int(float v) {
#if defined(__CUDA_ARCH__)
    return __float2int_rn(v);
#else
    return int32_t(std::nearbyint(v));
#endif
}

// Symmetric blockwise quantization with stochastic rounding, one value at a time (the CPU codecs
// and a CUDA kernel share this arithmetic). A block with absolute maximum m and levels
// [-qmax, qmax] has scale s = m / qmax, rounded to nearest; 1 for an all-zero block. Where m / qmax
// is below the smallest normal float it is rounded up instead (to the subnormal grid, at least the
// smallest subnormal), so that m / s <= qmax still holds: a rounded-down subnormal scale could
// be far too small (m = 190 * 2^-149 gives m / 127 = 1.496 * 2^-149, nearest 1 * 2^-149).
//
// A value x of the block (|x| <= m) has level y = x / s, computed as t = (x * pre) * inv16 = 2^16 y
// with inv16 = 2^16 / (s * pre) (pre is 2^64 for scales under 2^-64 and 1 otherwise, so inv16
// stays finite for tiny, even subnormal, scales; x * pre is exact, and so is the scaling by 2^16
// inside inv16, so t is 2^16 times the fp32 level y). t is rounded to the nearest integer T, so y
// is held in fixed point with 16 fraction bits (|T| <= qmax 2^16 plus a few units, far from int32
// overflow), then
//     q = clamp(floor((T + r) / 2^16), -qmax, qmax),   r uniform 16-bit in [0, 2^16),
// in exact integer arithmetic. That is floor(T / 2^16 + u) with u = r * 2^-16 uniform in [0, 1):
// q is floor(T / 2^16) + 1 with probability frac(T / 2^16), so E[q] = T / 2^16 exactly, which is
// within 2^-17 of a step of y (the rounding of t to T; zero where y is a multiple of 2^-16),
// short of the clamp. Decoding is mul_rn(q, s).
struct QuantBlock {
    float scale;
    float inv16;
    float pre;
};

STARLING_HD QuantBlock quant_block(float absmax, float qmax) {
    float s = absmax > 0.0f ? absmax / qmax : 1.0f;
    if (s < 0x1.0p-126f && std::fma(s, qmax, -absmax) < 0.0f) {  // the sign of s*qmax - m, exactly
        s = std::nextafter(s, 1.0f);
    }
    const float pre = s < 0x1.0p-64f ? 0x1.0p64f : 1.0f;
    return QuantBlock{s, (1.0f / (s * pre)) * 0x1.0p16f, pre};
}

// r16: the element's 16 random bits (only the low 16 bits are read).
STARLING_HD int32_t quantize_sr(float x, const QuantBlock& b, uint32_t r16, int32_t qmax) {
    const int32_t t = round_to_int((x * b.pre) * b.inv16);
    const int32_t q = (t + int32_t(r16 & 0xffffu)) >> 16;  // floor
    return q < -qmax ? -qmax : (q > qmax ? qmax : q);
}

// fp32 -> bf16 by stochastic rounding: a uniform 16-bit integer r16 (the low 16 bits of the
// argument) is added to the fp32 bit pattern, carrying into the high half, which is kept. A value
// between two bf16 neighbours rounds away from zero with probability equal to its distance from
// the nearer-to-zero one in units of the spacing, so the result is unbiased. Inf stays Inf (its
// low half is zero); NaN stays NaN (quieted, sign kept); a finite value above the largest finite
// bf16 (0x7f7f, about 3.39e38, i.e. within one bf16 ulp of FLT_MAX) rounds up to Inf with that
// probability.
STARLING_HD uint16_t bf16_round_sr(uint32_t bits, uint32_t r16) {
    const bool nan = (bits & 0x7fffffffu) > 0x7f800000u;
    return nan ? uint16_t((bits >> 16) | 0x0040u) : uint16_t((bits + (r16 & 0xffffu)) >> 16);
}

STARLING_HD uint32_t bf16_to_f32_bits(uint16_t h) { return uint32_t(h) << 16; }

}  // namespace starling
