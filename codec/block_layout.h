// The byte layout of the block codecs, Q8 and Q4 (README.md, "Element codecs"): the one
// definition every implementation of them includes. It needs nothing but <cstddef> and is C++17
// constexpr, so a CUDA codec includes it as the CPU codec (codec.cpp) does.
//
// A block is kBlock values: an fp32 absmax scale (little-endian) followed by the payload, Q8 one
// int8 per value in [-127, 127], Q4 two values in [-7, 7] per byte as two's-complement nibbles,
// low nibble first. Block b of a range starts at b times block_bytes; only the last block of a
// tensor may be short, and a short Q4 block of odd length pads its last byte with a zero nibble.
#pragma once

#include <cstddef>

namespace starling::codec::layout {

inline constexpr size_t kBlock = 64;
inline constexpr size_t kScaleBytes = 4;  // the fp32 scale, first in every block
inline constexpr int kQ8Max = 127;        // levels -127..127; -128 is never sent
inline constexpr int kQ4Max = 7;          // levels -7..7; -8 is never sent

constexpr size_t num_blocks(size_t n) { return n / kBlock + (n % kBlock != 0 ? 1 : 0); }

// Payload bytes of a block of len values: qmax is kQ8Max or kQ4Max.
constexpr size_t payload_bytes(int qmax, size_t len) {
    return qmax == kQ8Max ? len : (len + 1) / 2;
}

// Bytes of one whole block, scale included.
constexpr size_t block_bytes(int qmax) { return kScaleBytes + payload_bytes(qmax, kBlock); }

// Bytes of n values in blocks: whole blocks have even length, so Q4's payload is ceil(n / 2).
constexpr size_t encoded_bytes(int qmax, size_t n) {
    return kScaleBytes * num_blocks(n) + payload_bytes(qmax, n);
}

static_assert(block_bytes(kQ8Max) == 68 && block_bytes(kQ4Max) == 36);
static_assert(encoded_bytes(kQ4Max, 65) == 2 * kScaleBytes + 33);

}  // namespace starling::codec::layout
