// Per-element math shared by the CPU and CUDA backends: written once, so the CPU tests check the
// same arithmetic the GPU runs. Everything here is inline, header-only and __host__ __device__.
#pragma once

#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define STARLING_HD __host__ __device__ __forceinline__
#else
#define STARLING_HD inline
#endif

namespace starling {

// SiLU and its derivative: silu(x) = x * sigmoid(x).
template <typename T>
STARLING_HD T silu(T x) {
    return x / (T(1) + std::exp(-x));
}

template <typename T>
STARLING_HD T silu_grad(T x) {
    T s = T(1) / (T(1) + std::exp(-x));
    return s * (T(1) + x * (T(1) - s));
}

// Rotary embedding frequency for pair i of a head of size hs (Hugging Face Llama convention:
// element j is paired with element j + hs/2).
STARLING_HD double rope_inv_freq(int i, int hs, double theta) {
    return std::pow(theta, -2.0 * i / hs);
}

// RMSNorm's reciprocal root mean square of a row of C elements, from its sum of squares.
template <typename A>
STARLING_HD A rmsnorm_rstd(A sum_squares, int C, float eps) {
    return A(1) / std::sqrt(sum_squares / A(C) + A(eps));
}

// Rotates one RoPE pair (x0 = element j, x1 = element j + hs/2) by the angle with cosine c and
// sine s; the inverse rotation is the same call with -s.
template <typename T>
STARLING_HD void rope_rotate(T& x0, T& x1, T c, T s) {
    T r0 = x0 * c - x1 * s;
    T r1 = x1 * c + x0 * s;
    x0 = r0;
    x1 = r1;
}

// One AdamW element update with decoupled weight decay; bias corrections precomputed by the caller.
struct AdamWScalars {
    float lr;
    float beta1;
    float beta2;
    float eps;
    float weight_decay;
    float bias_correction1;  // 1 - beta1^t
    float bias_correction2;  // 1 - beta2^t
    float grad_scale;        // clipping factor applied to every gradient
};

template <typename T>
STARLING_HD void adamw_element(T& param, T& m, T& v, T grad, const AdamWScalars& s) {
    grad *= T(s.grad_scale);
    m = T(s.beta1) * m + (T(1) - T(s.beta1)) * grad;
    v = T(s.beta2) * v + (T(1) - T(s.beta2)) * grad * grad;
    T m_hat = m / T(s.bias_correction1);
    T v_hat = v / T(s.bias_correction2);
    param -= T(s.lr) * (m_hat / (std::sqrt(v_hat) + T(s.eps)) + T(s.weight_decay) * param);
}

// One element of an outer step (optimizer/outer.h), in the project's one sign convention: the
// update signal g (already scaled by the outer lr, pointing from phi towards where the round went)
// feeds the outer momentum delta, and phi moves by delta (heavy-ball) or by g + momentum * delta
// (Nesterov's look-ahead).
STARLING_HD void outer_element(float& phi, float& delta, float g, float momentum, bool nesterov) {
    delta = momentum * delta + g;
    phi += nesterov ? g + momentum * delta : delta;
}

// Counter-based random numbers: a pure function of (seed, index), so initialisation and stochastic
// rounding give the same values on every backend, thread count and resume point.
STARLING_HD uint64_t mix64(uint64_t x) {
    x += 0x9e3779b97f4a7c15ULL;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

STARLING_HD uint64_t hash_index(uint64_t seed, uint64_t index) {
    return mix64(mix64(seed) ^ index);
}

// Uniform in (0, 1), never exactly 0 so it can feed a logarithm.
STARLING_HD double uniform_open01(uint64_t bits) {
    return (double((bits >> 11) | 1ULL)) * 0x1.0p-53;
}

// Standard normal from (seed, index) by Box-Muller on two independent hashes.
STARLING_HD double normal_at(uint64_t seed, uint64_t index) {
    double u1 = uniform_open01(hash_index(seed, 2 * index));
    double u2 = uniform_open01(hash_index(seed, 2 * index + 1));
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

// Philox4x32-10 (Salmon, Moraes, Dror and Shaw, "Parallel random numbers: as easy as 1, 2, 3",
// SC 2011), bit-identical to Random123's philox4x32_10: a counter of four 32-bit words and a key
// of two are mixed by ten rounds; the output is four 32-bit words.
struct Philox4x32 {
    uint32_t v[4];
};

STARLING_HD void philox_mulhilo(uint32_t a, uint32_t b, uint32_t& hi, uint32_t& lo) {
    const uint64_t p = uint64_t(a) * uint64_t(b);
    hi = uint32_t(p >> 32);
    lo = uint32_t(p);
}

STARLING_HD Philox4x32 philox4x32_10(Philox4x32 ctr, uint32_t key0, uint32_t key1) {
    for (int round = 0; round < 10; round++) {
        if (round > 0) {
            key0 += 0x9E3779B9u;
            key1 += 0xBB67AE85u;
        }
        uint32_t hi0, lo0, hi1, lo1;
        philox_mulhilo(0xD2511F53u, ctr.v[0], hi0, lo0);
        philox_mulhilo(0xCD9E8D57u, ctr.v[2], hi1, lo1);
        ctr = Philox4x32{{hi1 ^ ctr.v[1] ^ key0, lo1, hi0 ^ ctr.v[3] ^ key1, lo0}};
    }
    return ctr;
}

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
