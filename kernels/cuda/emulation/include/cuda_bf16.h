// bf16 for kernels compiled as host C++ on the emulator: the storage type and the conversions the
// backend's kernels use, rounding to nearest even as the device does.
#pragma once

#include <cstdint>
#include <cstring>

struct __nv_bfloat16 {
    uint16_t bits = 0;
    __nv_bfloat16() = default;
    explicit __nv_bfloat16(float x);
    operator float() const {
        const uint32_t wide = uint32_t(bits) << 16;
        float x;
        std::memcpy(&x, &wide, sizeof x);
        return x;
    }
};

struct alignas(4) __nv_bfloat162 {
    __nv_bfloat16 x, y;
};

inline __nv_bfloat16 __float2bfloat16_rn(float x) {
    uint32_t u;
    std::memcpy(&u, &x, sizeof u);
    __nv_bfloat16 r;
    if ((u & 0x7fffffffu) > 0x7f800000u) {
        r.bits = uint16_t((u >> 16) | 0x0040u);  // a NaN stays a (quiet) NaN
    } else {
        r.bits = uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
    }
    return r;
}

inline __nv_bfloat16::__nv_bfloat16(float x) : bits(__float2bfloat16_rn(x).bits) {}

inline float __bfloat162float(__nv_bfloat16 x) { return float(x); }

inline __nv_bfloat162 __floats2bfloat162_rn(float a, float b) {
    return {__float2bfloat16_rn(a), __float2bfloat16_rn(b)};
}
