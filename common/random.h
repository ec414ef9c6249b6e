// Counter-based random numbers for every layer: initialisation (kernels, model), data order,
// partner matching and the codecs' stochastic rounding noise all draw from these pure functions,
// header-only and __host__ __device__.
#pragma once

#include <cmath>
#include <cstdint>

#include "common/host_device.h"

namespace starling {

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

}  // namespace starling
