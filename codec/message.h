// Messages: how a flat arena (a delta or whole weights, in manifest order) travels between peers as
// a fixed 64-byte header followed by chunks of at most kMaxChunkBytes, each checksummed, optionally
// zstd-compressed where that pays, and decoded straight into the destination arena.
//
// Which codec covers which part of the arena (the plan) is not sent: both sides derive it from the
// manifest, whose fingerprint the header carries, plus the plan kind and codec in the header.
// Layouts are documented in codec/README.md ("Messages"). The decoder treats every byte
// as hostile: each length, index and range is checked before use, and every problem throws
// starling::Error naming it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "model/manifest.h"
#include "codec/codec.h"
#include "codec/sparse.h"

namespace starling::codec {

// ---------------------------------------------------------------------------------------------
// Plans

enum class PlanKind : uint8_t {
    Delta =
        0,  // deltas or pseudo-gradients: one segment, Q8, Q4, F32 or TOPK, error feedback allowed
    State = 1,  // whole weights: 1-D and small tensors as F32, the rest BF16SR, Q8 or F32
    // Values at coordinates the round draws (fused NoLoCo's update sample, theta and phi at each,
    // optimizer/outer_round.h): one F32 segment of the header's element count, at most twice the
    // manifest's total.
    Sample = 2,
};

std::string_view plan_kind_name(PlanKind kind);  // "delta", "state", "sample"

// Tensors with fewer elements than this (and all 1-D tensors) go as F32 in state messages.
inline constexpr size_t kStateMinElements = 4096;

struct Segment {
    uint64_t offset = 0;  // first element, into the arena
    uint64_t numel = 0;
    Codec codec = Codec::F32;
    // Global element index of the segment's first element as the rounding RNG sees it (the
    // first_index of codec::encode): the sum of the earlier segments' sizes, each rounded up to
    // whole blocks, so it is always a multiple of kBlock and no two elements of a message share a
    // counter. It equals offset whenever the earlier segments are whole blocks. (A TOPK segment
    // is a delta plan's only one: its first index is 0.)
    uint64_t first_index = 0;

    bool operator==(const Segment&) const = default;
};

// One segment over the whole arena. Throws starling::Error unless codec is Q8, Q4, F32 or TOPK.
std::vector<Segment> delta_plan(const ParameterManifest& manifest, Codec codec);
// 1-D tensors and tensors under kStateMinElements as F32, the rest with codec; adjacent tensors
// with the same codec merge. Throws starling::Error unless codec is BF16SR, Q8 or F32.
std::vector<Segment> state_plan(const ParameterManifest& manifest, Codec codec);

// Everything a message's layout depends on; both sides build it from the same manifest.
struct MessagePlan {
    PlanKind kind = PlanKind::Delta;
    Codec codec = Codec::Q8;   // the requested codec (segments may use F32 in state plans)
    uint64_t numel = 0;        // arena size
    uint64_t fingerprint = 0;  // the manifest fingerprint as a number
    SparseFormat sparse;       // TOPK's format (the header carries it); unused by other codecs
    std::vector<Segment> segments;
};

// sparse is checked where codec is TOPK. kind is Delta or State (a sample's plan is sample_plan).
MessagePlan make_plan(const ParameterManifest& manifest, PlanKind kind, Codec codec,
                      const SparseFormat& sparse = {});
// `count` values as F32; throws starling::Error unless count is 1 to twice the manifest's total.
MessagePlan sample_plan(const ParameterManifest& manifest, uint64_t count);

// How far a value decoded from a message of `plan` may lie from the value its sender encoded, at
// each arena index of `at`, told from the decoded arena alone: 0 in F32 segments; in BF16SR ones
// one bf16 step at the decoded value (2^-7 of it); in Q8 and Q4 ones one level of the value's
// block (the block's largest decoded magnitude over qmax - 1, for stochastic rounding leaves the
// largest value at qmax or one level under). Throws starling::Error for a TOPK plan or an index
// past the arena.
std::vector<float> rounding_bounds(const MessagePlan& plan, std::span<const float> decoded,
                                   std::span<const uint64_t> at);

// A message's payload bytes before zstd, headers aside: what an exchange moves at most.
uint64_t payload_bytes(const MessagePlan& plan);

// The 16 hex digits of ParameterManifest::fingerprint() as the number the header carries, and
// back. Throws starling::Error for anything but 16 hex digits.
uint64_t fingerprint_value(std::string_view hex);
std::string fingerprint_hex(uint64_t value);

// ---------------------------------------------------------------------------------------------
// Framing

inline constexpr uint32_t kMessageMagic = 0x4753'4D53;  // "SMSG" as little-endian bytes
inline constexpr uint16_t kMessageVersion = 1;
inline constexpr size_t kHeaderBytes = 64;
inline constexpr size_t kChunkHeaderBytes = 48;
inline constexpr size_t kMaxChunkBytes = size_t{4} << 20;  // uncompressed payload of one chunk

inline constexpr uint8_t kHeaderFlagZstd = 1;  // header: the sender tried zstd on each chunk
inline constexpr uint8_t kChunkFlagZstd = 1;   // chunk: the payload is one zstd stream

// What a header says, after checking.
struct MessageHeader {
    PlanKind kind = PlanKind::Delta;
    Codec codec = Codec::Q8;
    uint64_t numel = 0;
    uint64_t fingerprint = 0;
    uint64_t round = 0;
    uint64_t node_id = 0;  // the sender
    uint32_t stream = 0;
    SparseFormat sparse;  // TOPK only
    bool zstd = false;
    uint32_t chunk_count = 0;
    uint64_t checksum = 0;  // xxh3 of header bytes 0-55; seeds every chunk checksum
};

// Elements of a segment with this codec that one chunk holds: whole blocks (whole TOPK chunks of
// the plan's format), at most kMaxChunkBytes encoded.
uint64_t max_chunk_elements(Codec codec, const SparseFormat& sparse = {});

// Streams one message, one framed chunk at a time, so a sender never holds the whole message.
// The rounding key is also what the header says about the sender: node_id, round and stream.
class MessageEncoder {
public:
    // source (and residual, when given) are arenas of plan.numel floats and must outlive the
    // encoder. residual turns on error feedback (delta plans only): it is added to the source
    // and left holding what the message did not carry; with TOPK it is first multiplied by
    // feedback_decay (in [0, 1]; other codecs take only 1). try_zstd compresses each chunk with
    // zstd and keeps the result where it is at least 5% smaller.
    MessageEncoder(MessagePlan plan, const RoundingKey& key, const float* source, float* residual,
                   bool try_zstd, float feedback_decay = 1.0f);
    ~MessageEncoder();
    MessageEncoder(const MessageEncoder&) = delete;
    MessageEncoder& operator=(const MessageEncoder&) = delete;

    const std::vector<std::byte>& header_bytes() const { return header_; }
    uint32_t chunk_count() const { return chunk_count_; }
    // Writes the next framed chunk (chunk header + payload) into out, replacing its contents;
    // false once every chunk has been produced. Throws starling::Error where the element codec
    // refuses the values (a NaN or Inf in a block-coded range).
    bool next_chunk(std::vector<std::byte>& out);

private:
    MessagePlan plan_;
    RoundingKey key_;
    const float* source_;
    float* residual_;
    bool try_zstd_;
    float feedback_decay_;
    std::vector<std::byte> header_;
    uint64_t header_checksum_ = 0;
    uint32_t chunk_count_ = 0;
    uint32_t next_index_ = 0;
    size_t segment_ = 0;  // cursor: segment and element within it
    uint64_t element_ = 0;
    std::vector<std::byte> zbuf_;
    struct Zstd;
    std::unique_ptr<Zstd> zstd_;
};

// Receives one message into a destination arena. Each chunk is checked and decoded straight into
// place, so on an error the arena holds a partial message and must be discarded; the decoder then
// refuses further input.
class MessageDecoder {
public:
    // expected_fingerprint: this node's manifest fingerprint (16 hex digits); manifest: to rebuild
    // the plan the header names; destination: arena_size floats (the manifest's total; a sample
    // message's count, at most twice that).
    MessageDecoder(std::string_view expected_fingerprint, const ParameterManifest& manifest,
                   float* destination, size_t arena_size);
    ~MessageDecoder();
    MessageDecoder(const MessageDecoder&) = delete;
    MessageDecoder& operator=(const MessageDecoder&) = delete;

    void accept_header(std::span<const std::byte> bytes);
    void accept_chunk(std::span<const std::byte> bytes);
    bool complete() const { return complete_; }
    bool failed() const { return failed_; }
    bool has_header() const { return has_header_; }
    const MessageHeader& header() const { return header_; }  // valid once accept_header returned
    const MessagePlan& plan() const { return plan_; }

private:
    void header_impl(std::span<const std::byte> bytes);
    void chunk_impl(std::span<const std::byte> bytes);

    uint64_t expected_fingerprint_;
    const ParameterManifest& manifest_;
    float* destination_;
    size_t arena_size_;
    MessageHeader header_;
    MessagePlan plan_;
    bool has_header_ = false;
    bool complete_ = false;
    bool failed_ = false;
    std::string first_error_;
    uint32_t next_index_ = 0;
    size_t segment_ = 0;
    uint64_t element_ = 0;
    std::vector<std::byte> scratch_;  // decompressed payload, never above kMaxChunkBytes
    struct Zstd;
    std::unique_ptr<Zstd> zstd_;
};

// A whole encoded message: its header and its framed chunks.
struct EncodedMessage {
    std::vector<std::byte> header;
    std::vector<std::vector<std::byte>> chunks;
    size_t bytes() const;  // on the wire: the header and every chunk
};

// Runs an encoder to its end.
EncodedMessage encode_to_end(MessageEncoder& encoder);
// Feeds a whole message to a decoder; throws starling::Error on any problem, including a message
// that ends before it is complete.
void decode_to_end(std::span<const std::byte> header,
                   std::span<const std::vector<std::byte>> chunks, MessageDecoder& decoder);

// The same as one list of parts, header first, for tests and benchmarks that cut and alter them.
std::vector<std::vector<std::byte>> encode_message(const MessagePlan& plan, const RoundingKey& key,
                                                   const float* source, float* residual,
                                                   bool try_zstd);
void decode_message(const std::vector<std::vector<std::byte>>& parts,
                    std::string_view expected_fingerprint, const ParameterManifest& manifest,
                    float* destination, size_t arena_size);

}  // namespace starling::codec
