// TOPK, the sparse codec for deltas (README.md, "TOPK"): the values are cut into chunks, each
// chunk keeps its largest magnitudes, their positions go Elias-Fano coded (a fixed size within 10%
// of the entropy of a random choice of positions) and their values in a few bits by stochastic
// rounding between the smallest and the largest kept magnitude. Everything not sent stays in an
// error-feedback residual, decayed each round.
//
// The size of an encoding is a pure function of (format, n), like the block codecs', and a range
// of whole chunks encodes and decodes on its own, so a message cuts it at chunk boundaries.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "codec/codec.h"

namespace starling::codec {

struct SparseFormat {
    uint32_t chunk = 4096;    // values per chunk (the last chunk of a span may be shorter)
    uint32_t keep = 61;       // values a whole chunk keeps; a short one keeps its share, rounded up
    uint32_t value_bits = 2;  // per kept value: a sign bit and value_bits - 1 bits of magnitude

    bool operator==(const SparseFormat&) const = default;
};

inline constexpr uint32_t kSparseMinChunk = 64;
inline constexpr uint32_t kSparseMaxChunk = 32768;  // the message header holds it in 16 bits
inline constexpr uint32_t kSparseMinValueBits = 2;
inline constexpr uint32_t kSparseMaxValueBits = 8;

// Throws starling::Error naming the field unless chunk is in [64, 32768], keep in [1, chunk] and
// value_bits in [2, 8].
void check_sparse_format(const SparseFormat& format);
// The format keeping round(density * chunk) values of each chunk (at least one); checked.
SparseFormat sparse_format(uint32_t chunk, double density, uint32_t value_bits);
// Values a chunk of len values keeps: ceil(keep * len / chunk).
uint32_t sparse_keep(const SparseFormat& format, size_t len);

// Bytes an encoding of n values takes.
size_t sparse_encoded_bytes(const SparseFormat& format, size_t n);

// Encodes x into out (exactly sparse_encoded_bytes bytes). first_index is the global index of
// x[0] for the rounding noise (as codec::encode). Throws starling::Error for a wrong output size
// or a chunk holding NaN or Inf (after which out must be discarded).
void sparse_encode(const SparseFormat& format, std::span<const float> x, uint64_t first_index,
                   const RoundingKey& key, std::span<std::byte> out);

// Error feedback with decay: encodes x = delta + decay * residual (the product rounded on its own)
// and leaves residual = x - decode(out), so what is sent plus the new residual is x: exactly
// residual = x where nothing was sent. decay is in [0, 1]; 1 keeps every unsent value in full.
void sparse_encode_with_feedback(const SparseFormat& format, float decay,
                                 std::span<const float> delta, std::span<float> residual,
                                 uint64_t first_index, const RoundingKey& key,
                                 std::span<std::byte> out);

// Decodes in (exactly sparse_encoded_bytes(format, out.size()) bytes) into out, every value not
// sent set to zero. The input is hostile: a wrong size, a NaN, Inf, negative or inverted
// magnitude range, positions out of range, repeated or out of order, a wrong count of them, or
// non-zero padding throws starling::Error naming the chunk and the problem; out must then be
// discarded.
void sparse_decode(const SparseFormat& format, std::span<const std::byte> in, std::span<float> out);

}  // namespace starling::codec
