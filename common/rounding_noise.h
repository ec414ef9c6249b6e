// Where the codecs' stochastic rounding noise comes from, one element at a time: the reference
// that codec.cpp's batched Philox must match bit for bit, and what a CUDA kernel would call.
//
// Element i of (node_id, round, stream) draws 16 random bits: half i % 2 (0: the low 16 bits,
// 1: the high 16 bits) of the 32-bit word (i % 8) / 2 of
//     philox4x32_10(counter = {round_lo, round_hi ^ g_hi, stream, g_lo}, key = {k_lo, k_hi})
// where g = i / 8 (g_lo, g_hi its 32-bit halves), k = mix64(node_id), and round_lo / round_hi are
// the halves of round. So eight consecutive elements share one Philox call (its four words, read
// as little-endian u16s, are the bits of elements 8g .. 8g+7 in order), and every element's bits
// are a pure function of (node_id, round, stream, i). (g_hi is folded into the round's high word
// so indices past 2^35 stay distinct; for rounds under 2^32, the usual case, the counter is
// injective in (round, stream, i / 8).)
#pragma once

#include <cstdint>

#include "common/host_device.h"
#include "common/random.h"

namespace starling::codec {

struct PhiloxStream {
    uint32_t key0;  // low half of mix64(node_id)
    uint32_t key1;  // high half
    uint32_t round_lo;
    uint32_t round_hi;
    uint32_t stream;
};

STARLING_HD PhiloxStream philox_stream(uint64_t node_id, uint64_t round, uint32_t stream) {
    const uint64_t k = mix64(node_id);
    return PhiloxStream{uint32_t(k), uint32_t(k >> 32), uint32_t(round), uint32_t(round >> 32),
                        stream};
}

// The counter of element group g (elements 8g .. 8g+7).
STARLING_HD Philox4x32 philox_counter(const PhiloxStream& s, uint64_t group) {
    return Philox4x32{{s.round_lo, s.round_hi ^ uint32_t(group >> 32), s.stream, uint32_t(group)}};
}

// The four words of element group g.
STARLING_HD Philox4x32 rounding_words(const PhiloxStream& s, uint64_t group) {
    return philox4x32_10(philox_counter(s, group), s.key0, s.key1);
}

// The 16 rounding bits of element i, in [0, 2^16).
STARLING_HD uint32_t rounding_bits(const PhiloxStream& s, uint64_t index) {
    const uint32_t word = rounding_words(s, index >> 3).v[(index & 7) >> 1];
    return (index & 1) != 0 ? word >> 16 : word & 0xffffu;
}

}  // namespace starling::codec
