// The device side of CUDA as kernel source sees it, for kernels compiled as host C++: qualifiers,
// the built-in indices, barriers, warp collectives, atomics, vector types and the math
// intrinsics the backend's kernels use. Collectives go through the scheduler
// (kernels/cuda/emulation/scheduler.h), which checks that the whole warp or block takes part.
#pragma once

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <source_location>
#include <type_traits>

#include "kernels/cuda/emulation/scheduler.h"

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline __attribute__((always_inline))
#define __launch_bounds__(...)
#define __align__(n) alignas(n)

#define threadIdx (::starling::cuda::emulation::thread_index())
#define blockIdx (::starling::cuda::emulation::block_index())
#define blockDim (::starling::cuda::emulation::block_dim())
#define gridDim (::starling::cuda::emulation::grid_dim())
inline constexpr int warpSize = 32;

struct alignas(16) float4 {
    float x, y, z, w;
};
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }

inline void __syncthreads(std::source_location where = std::source_location::current()) {
    ::starling::cuda::emulation::block_barrier(where);
}

inline void __syncwarp(unsigned mask = 0xffffffffu,
                       std::source_location where = std::source_location::current()) {
    ::starling::cuda::emulation::warp_barrier(mask, "__syncwarp", where);
}

namespace starling::cuda::emulation {

// Every lane of the warp contributes `mine`; returns the area holding all 32 contributions (lane i
// at [i]), readable until this lane's next collective.
template <typename T>
const T* exchange(unsigned mask, const T& mine, const char* what, std::source_location where) {
    static_assert(std::is_trivially_copyable_v<T> && sizeof(T) <= kExchangeBytes);
    require_full_warp(mask, what, where);
    T* area = static_cast<T*>(warp_exchange_area(sizeof(T)));
    std::memcpy(&area[lane_index()], &mine, sizeof(T));
    warp_barrier(mask, what, where);
    return area;
}

template <typename T>
T shuffle_from(unsigned mask, T v, int source, int width, const char* what,
               std::source_location where) {
    const T* all = exchange(mask, v, what, where);
    const int lane = lane_index();
    if (width <= 0 || width > kWarpSize || (width & (width - 1)) != 0) {
        fault(std::string(what) + " with width " + std::to_string(width) +
                  " (not a power of two up to 32)",
              where);
    }
    // Lanes outside this lane's segment of `width` read their own value, as on a device.
    const int segment = lane & ~(width - 1);
    if (source < segment || source >= segment + width) return v;
    return all[source];
}

}  // namespace starling::cuda::emulation

template <typename T>
T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32,
                  std::source_location where = std::source_location::current()) {
    using namespace ::starling::cuda::emulation;
    return shuffle_from(mask, v, lane_index() ^ lane_mask, width, "__shfl_xor_sync", where);
}

template <typename T>
T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = 32,
                   std::source_location where = std::source_location::current()) {
    using namespace ::starling::cuda::emulation;
    return shuffle_from(mask, v, lane_index() + int(delta), width, "__shfl_down_sync", where);
}

template <typename T>
T __shfl_sync(unsigned mask, T v, int source_lane, int width = 32,
              std::source_location where = std::source_location::current()) {
    using namespace ::starling::cuda::emulation;
    const int segment = lane_index() & ~(width - 1);
    return shuffle_from(mask, v, segment + (source_lane & (width - 1)), width, "__shfl_sync",
                        where);
}

inline unsigned __ballot_sync(unsigned mask, int predicate,
                              std::source_location where = std::source_location::current()) {
    using namespace ::starling::cuda::emulation;
    const int* all = exchange(mask, predicate, "__ballot_sync", where);
    unsigned bits = 0;
    for (int lane = 0; lane < kWarpSize; lane++) bits |= unsigned(all[lane] != 0) << lane;
    return bits;
}

inline int __any_sync(unsigned mask, int predicate,
                      std::source_location where = std::source_location::current()) {
    using namespace ::starling::cuda::emulation;
    const int* all = exchange(mask, predicate, "__any_sync", where);
    return std::any_of(all, all + kWarpSize, [](int p) { return p != 0; });
}

inline int __all_sync(unsigned mask, int predicate,
                      std::source_location where = std::source_location::current()) {
    using namespace ::starling::cuda::emulation;
    const int* all = exchange(mask, predicate, "__all_sync", where);
    return std::all_of(all, all + kWarpSize, [](int p) { return p != 0; });
}

// Atomics: real host atomics, so the race checker sees them as synchronised accesses.
template <typename T>
T atomicMin(T* address, T value) {
    std::atomic_ref<T> slot(*address);
    T old = slot.load();
    while (value < old && !slot.compare_exchange_weak(old, value)) {
    }
    return old;
}

template <typename T>
T atomicMax(T* address, T value) {
    std::atomic_ref<T> slot(*address);
    T old = slot.load();
    while (value > old && !slot.compare_exchange_weak(old, value)) {
    }
    return old;
}

template <typename T>
T atomicAdd(T* address, T value) {
    std::atomic_ref<T> slot(*address);
    T old = slot.load();
    while (!slot.compare_exchange_weak(old, T(old + value))) {
    }
    return old;
}

// Math: the host's functions, which the device's agree with to a few ulp; the rounding-mode
// intrinsics are exact where the host rounds to nearest even by default.
using std::exp;
using std::log;
using std::max;
using std::min;
using std::sqrt;
inline float expf(float x) { return std::exp(x); }
inline float logf(float x) { return std::log(x); }
inline float fmaxf(float a, float b) { return std::fmax(a, b); }
inline float fminf(float a, float b) { return std::fmin(a, b); }
inline float fmaf(float a, float b, float c) { return std::fma(a, b, c); }
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline float __fmul_rn(float a, float b) {
    volatile float product = a * b;  // never contracted into an FMA, as on a device
    return product;
}
inline int __float2int_rn(float x) { return int(std::nearbyint(x)); }
inline unsigned __float_as_uint(float x) {
    unsigned u;
    std::memcpy(&u, &x, sizeof u);
    return u;
}
inline float __uint_as_float(unsigned u) {
    float x;
    std::memcpy(&x, &u, sizeof x);
    return x;
}
inline int __float_as_int(float x) { return int(__float_as_uint(x)); }
inline float __int_as_float(int i) { return __uint_as_float(unsigned(i)); }
