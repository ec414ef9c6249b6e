// Element codecs for what peers exchange: deltas (Q8, Q4, with optional error feedback) and whole
// weights (bf16 with stochastic rounding, blockwise Q8, F32). Stochastic rounding draws from a
// counter-based RNG keyed by the sender and the round, so every encode is reproducible.
//
// Block codecs work on blocks of kBlock = 64 values. Any range of whole blocks encodes and decodes
// on its own (a message is cut into chunks at block boundaries and each chunk is decoded straight
// into the destination arena); only the last block of a tensor may be short.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include "codec/block_layout.h"

namespace starling::codec {

enum class Codec : uint8_t {
    F32 = 0,     // raw little-endian fp32
    BF16SR = 1,  // bf16 by stochastic rounding of the fp32 bits (state messages)
    Q8 = 2,      // symmetric int8, fp32 absmax scale per block, stochastic rounding
    Q4 = 3,      // int4 in [-7, 7], two per byte (low nibble first), fp32 scale per block
    TOPK = 4,    // sparse deltas with its own format and functions (codec/sparse.h)
};

inline constexpr size_t kBlock = layout::kBlock;

// "F32", "BF16SR", "Q8", "Q4", "TOPK".
std::string_view codec_name(Codec codec);
// Throws starling::Error for a byte that is not a codec.
Codec codec_from_byte(uint8_t byte);
// The codec codec_name() calls name; throws starling::Error for any other name.
Codec codec_from_name(std::string_view name);

// Bytes an encoding of n values takes, a pure function of (codec, n). The functions below take
// every codec but TOPK, whose size and coding depend on its format (codec/sparse.h): they throw
// starling::Error for it.
size_t encoded_bytes(Codec codec, size_t n);

// Where the rounding noise comes from: Philox4x32-10 keyed by hash(node_id), with the counter made
// of (round, stream, element index), so the same element of the same round always draws the same
// number and encodes are bit-reproducible on any backend and thread count.
struct RoundingKey {
    uint64_t node_id = 0;
    uint64_t round = 0;
    uint32_t stream = 0;  // which message or tensor of the round
};

// Encodes x, whose first element has global index first_index (a multiple of kBlock for block
// codecs; it feeds the RNG counter), into out (exactly encoded_bytes(codec, x.size()) bytes).
void encode(Codec codec, std::span<const float> x, uint64_t first_index, const RoundingKey& key,
            std::span<std::byte> out);

// Decodes in (exactly encoded_bytes(codec, out.size()) bytes) into out. The input is hostile: a
// wrong size, or a NaN, Inf or negative block scale, throws starling::Error naming the problem;
// nothing is read or written out of bounds.
void decode(Codec codec, std::span<const std::byte> in, std::span<float> out);

// Error feedback: encodes x = delta + residual and leaves residual = x - decode(encoded), so what
// was sent plus the final residual always equals the sum of the inputs.
void encode_with_feedback(Codec codec, std::span<const float> delta, std::span<float> residual,
                          uint64_t first_index, const RoundingKey& key, std::span<std::byte> out);

// While one lives, every codec call on its thread runs on that thread alone instead of sharing
// large ranges out to OpenMP's team. An exchange codes each chunk on the thread that moves it: a
// team per chunk spun between chunks and took the cores gRPC's threads needed, and one thread
// codes a 4 MiB chunk faster than any link but loopback delivers it. Other threads (a round
// thread training with a full team) are not affected.
class SerialCoding {
public:
    SerialCoding();
    ~SerialCoding();
    SerialCoding(const SerialCoding&) = delete;
    SerialCoding& operator=(const SerialCoding&) = delete;
};

}  // namespace starling::codec
