#include "codec/message.h"

#include <xxhash.h>
#include <zstd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <utility>

#include "codec/block_layout.h"
#include "common/error.h"

namespace starling::codec {

namespace {

// Header field offsets (see README.md, "Messages").
constexpr size_t kHMagic = 0, kHVersion = 4, kHKind = 6, kHCodec = 7, kHBlock = 8, kHFlags = 10,
                 kHReserved8 = 11, kHStream = 12, kHNumel = 16, kHFingerprint = 24, kHRound = 32,
                 kHNode = 40, kHChunks = 48, kHSparse = 52, kHChecksum = 56;
// Chunk header field offsets.
constexpr size_t kCIndex = 0, kCSegment = 4, kCFirst = 8, kCCount = 16, kCPayload = 24,
                 kCUncompressed = 28, kCFlags = 32, kCReserved = 33, kCChecksum = 40;

constexpr int kZstdLevel = 1;

static_assert(kHChecksum + 8 == kHeaderBytes);
static_assert(kCChecksum + 8 == kChunkHeaderBytes);

void put16(std::byte* p, uint16_t v) {
    for (int i = 0; i < 2; i++) p[i] = static_cast<std::byte>(v >> (8 * i));
}
void put32(std::byte* p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = static_cast<std::byte>(v >> (8 * i));
}
void put64(std::byte* p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = static_cast<std::byte>(v >> (8 * i));
}
uint64_t get(const std::byte* p, int bytes) {
    uint64_t v = 0;
    for (int i = 0; i < bytes; i++) v |= static_cast<uint64_t>(p[i]) << (8 * i);
    return v;
}
uint16_t get16(const std::byte* p) { return static_cast<uint16_t>(get(p, 2)); }
uint32_t get32(const std::byte* p) { return static_cast<uint32_t>(get(p, 4)); }
uint64_t get64(const std::byte* p) { return get(p, 8); }

uint64_t header_checksum(const std::byte* header) { return XXH3_64bits(header, kHChecksum); }

// Seeded by the header checksum, so a chunk only verifies inside the message it was made for.
uint64_t chunk_checksum(const std::byte* chunk_header, std::span<const std::byte> payload,
                        uint64_t seed) {
    const uint64_t header_hash = XXH3_64bits_withSeed(chunk_header, kCChecksum, seed);
    return XXH3_64bits_withSeed(payload.data(), payload.size(), header_hash);
}

uint64_t round_up_blocks(uint64_t n) { return (n + kBlock - 1) / kBlock * kBlock; }

std::string num(uint64_t v) { return std::to_string(v); }

bool valid_for(PlanKind kind, Codec codec) {
    if (kind == PlanKind::Delta)
        return codec == Codec::Q8 || codec == Codec::Q4 || codec == Codec::F32 ||
               codec == Codec::TOPK;
    if (kind == PlanKind::Sample) return codec == Codec::F32;
    return codec == Codec::BF16SR || codec == Codec::Q8 || codec == Codec::F32;
}

void require_valid(PlanKind kind, Codec codec) {
    if (!valid_for(kind, codec)) {
        throw Error("message plan: codec " + std::string(codec_name(codec)) +
                    " is not valid for a " + std::string(plan_kind_name(kind)) +
                    " message (delta: Q8, Q4, F32, TOPK; state: BF16SR, Q8, F32; sample: F32)");
    }
}

void assign_first_indices(std::vector<Segment>& segments) {
    uint64_t index = 0;
    for (Segment& s : segments) {
        s.first_index = index;
        index += round_up_blocks(s.numel);
    }
}

// What a chunk's element range aligns to: blocks of 64, or TOPK's chunks.
uint64_t unit_of(const MessagePlan& plan, const Segment& seg) {
    return seg.codec == Codec::TOPK ? plan.sparse.chunk : kBlock;
}

// The most chunks a message of this plan can have: one per unit.
uint64_t total_units(const MessagePlan& plan) {
    uint64_t units = 0;
    for (const Segment& s : plan.segments) {
        const uint64_t unit = unit_of(plan, s);
        units += (s.numel + unit - 1) / unit;
    }
    return units;
}

size_t range_bytes(const MessagePlan& plan, const Segment& seg, uint64_t count) {
    return seg.codec == Codec::TOPK ? sparse_encoded_bytes(plan.sparse, count)
                                    : encoded_bytes(seg.codec, count);
}

// The header's 32-bit field at offset 52: TOPK's keep (low 16 bits) and value bits (next 8).
uint32_t sparse_field(const MessagePlan& plan) {
    return plan.codec == Codec::TOPK ? plan.sparse.keep | plan.sparse.value_bits << 16 : 0;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Plans

std::string_view plan_kind_name(PlanKind kind) {
    switch (kind) {
        case PlanKind::Delta: return "delta";
        case PlanKind::State: return "state";
        case PlanKind::Sample: return "sample";
    }
    return "unknown";
}

std::vector<Segment> delta_plan(const ParameterManifest& manifest, Codec codec) {
    require_valid(PlanKind::Delta, codec);
    std::vector<Segment> segments{{0, manifest.total(), codec, 0}};
    return segments;
}

std::vector<Segment> state_plan(const ParameterManifest& manifest, Codec codec) {
    require_valid(PlanKind::State, codec);
    std::vector<Segment> segments;
    for (const TensorInfo& t : manifest.tensors()) {
        const bool exact = t.shape.size() <= 1 || t.numel < kStateMinElements;
        const Codec c = exact ? Codec::F32 : codec;
        if (!segments.empty() && segments.back().codec == c &&
            segments.back().offset + segments.back().numel == t.offset) {
            segments.back().numel += t.numel;
        } else {
            segments.push_back({t.offset, t.numel, c, 0});
        }
    }
    assign_first_indices(segments);
    return segments;
}

MessagePlan make_plan(const ParameterManifest& manifest, PlanKind kind, Codec codec,
                      const SparseFormat& sparse) {
    if (kind == PlanKind::Sample)
        throw Error("message plan: a sample's plan takes its count (sample_plan)");
    MessagePlan plan;
    plan.kind = kind;
    plan.codec = codec;
    if (codec == Codec::TOPK) {
        check_sparse_format(sparse);
        plan.sparse = sparse;
    }
    plan.numel = manifest.total();
    plan.fingerprint = fingerprint_value(manifest.fingerprint());
    plan.segments =
        kind == PlanKind::Delta ? delta_plan(manifest, codec) : state_plan(manifest, codec);
    return plan;
}

MessagePlan sample_plan(const ParameterManifest& manifest, uint64_t count) {
    if (count == 0 || count > 2 * manifest.total())
        throw Error("message plan: a sample of " + num(count) + " values for " +
                    num(manifest.total()) + " parameters (at least 1, at most 2 a parameter)");
    MessagePlan plan;
    plan.kind = PlanKind::Sample;
    plan.codec = Codec::F32;
    plan.numel = count;
    plan.fingerprint = fingerprint_value(manifest.fingerprint());
    plan.segments = {{0, count, Codec::F32, 0}};
    return plan;
}

std::vector<float> rounding_bounds(const MessagePlan& plan, std::span<const float> decoded,
                                   std::span<const uint64_t> at) {
    std::vector<float> bounds;
    bounds.reserve(at.size());
    for (const uint64_t i : at) {
        if (i >= decoded.size() || i >= plan.numel)
            throw Error("rounding bounds: index " + num(i) + " past the arena of " +
                        num(plan.numel));
        const auto seg = std::prev(
            std::upper_bound(plan.segments.begin(), plan.segments.end(), i,
                             [](uint64_t index, const Segment& s) { return index < s.offset; }));
        switch (seg->codec) {
            case Codec::F32: bounds.push_back(0.0f); break;
            case Codec::BF16SR:
                bounds.push_back(std::ldexp(std::abs(decoded[i]), -7) + 1e-37f);
                break;
            case Codec::Q8:
            case Codec::Q4: {
                const uint64_t first = seg->offset + (i - seg->offset) / kBlock * kBlock;
                const uint64_t end = std::min(first + kBlock, seg->offset + seg->numel);
                float largest = 0.0f;
                for (uint64_t j = first; j < end; j++)
                    largest = std::max(largest, std::abs(decoded[j]));
                const int levels = (seg->codec == Codec::Q8 ? layout::kQ8Max : layout::kQ4Max) - 1;
                bounds.push_back(largest / static_cast<float>(levels) * (1.0f + 1e-6f));
                break;
            }
            case Codec::TOPK: throw Error("rounding bounds: a TOPK message keeps no bound");
        }
    }
    return bounds;
}

uint64_t payload_bytes(const MessagePlan& plan) {
    uint64_t bytes = 0;
    for (const Segment& s : plan.segments) bytes += range_bytes(plan, s, s.numel);
    return bytes;
}

uint64_t fingerprint_value(std::string_view hex) {
    if (hex.size() != 16) {
        throw Error("model fingerprint '" + std::string(hex) + "' is not 16 hex digits");
    }
    uint64_t v = 0;
    for (char c : hex) {
        int d;
        if (c >= '0' && c <= '9')
            d = c - '0';
        else if (c >= 'a' && c <= 'f')
            d = c - 'a' + 10;
        else if (c >= 'A' && c <= 'F')
            d = c - 'A' + 10;
        else
            throw Error("model fingerprint '" + std::string(hex) + "' is not 16 hex digits");
        v = v << 4 | static_cast<uint64_t>(d);
    }
    return v;
}

std::string fingerprint_hex(uint64_t value) {
    char buf[17];
    std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(value));
    return buf;
}

uint64_t max_chunk_elements(Codec codec, const SparseFormat& sparse) {
    if (codec == Codec::TOPK) {
        return std::max<uint64_t>(1, kMaxChunkBytes / sparse_encoded_bytes(sparse, sparse.chunk)) *
               sparse.chunk;
    }
    uint64_t blocks = kMaxChunkBytes / encoded_bytes(codec, kBlock);
    while (blocks > 1 && encoded_bytes(codec, blocks * kBlock) > kMaxChunkBytes) blocks--;
    return blocks * kBlock;
}

// ---------------------------------------------------------------------------------------------
// Encoder

struct MessageEncoder::Zstd {
    ZSTD_CCtx* cctx = nullptr;
    ~Zstd() { ZSTD_freeCCtx(cctx); }
};

MessageEncoder::MessageEncoder(MessagePlan plan, const RoundingKey& key, const float* source,
                               float* residual, bool try_zstd, float feedback_decay)
    : plan_(std::move(plan)),
      key_(key),
      source_(source),
      residual_(residual),
      try_zstd_(try_zstd),
      feedback_decay_(feedback_decay) {
    require_valid(plan_.kind, plan_.codec);
    if (plan_.codec == Codec::TOPK) check_sparse_format(plan_.sparse);
    if (!(feedback_decay_ >= 0.0f && feedback_decay_ <= 1.0f) ||
        (feedback_decay_ != 1.0f && plan_.codec != Codec::TOPK)) {
        throw Error("message encoder: feedback decay " + std::to_string(feedback_decay_) +
                    " (TOPK takes one in [0, 1], other codecs only 1)");
    }
    if (source_ == nullptr) throw Error("message encoder: no source arena");
    if (residual_ != nullptr && plan_.kind != PlanKind::Delta) {
        throw Error("message encoder: error feedback applies to delta messages only");
    }
    // The plan must tile the arena in order, as make_plan builds it, or the receiver's rebuilt
    // plan would disagree with what is sent.
    uint64_t offset = 0, index = 0, chunks = 0;
    for (const Segment& s : plan_.segments) {
        if (s.offset != offset || s.numel == 0 || s.first_index != index) {
            throw Error("message encoder: plan segments do not tile the arena in order");
        }
        offset += s.numel;
        index += round_up_blocks(s.numel);
        const uint64_t per_chunk = max_chunk_elements(s.codec, plan_.sparse);
        chunks += (s.numel + per_chunk - 1) / per_chunk;
    }
    if (offset != plan_.numel || plan_.numel == 0) {
        throw Error("message encoder: plan covers " + num(offset) + " of " + num(plan_.numel) +
                    " elements");
    }
    if (chunks > UINT32_MAX) throw Error("message encoder: too many chunks");
    chunk_count_ = static_cast<uint32_t>(chunks);

    header_.assign(kHeaderBytes, std::byte{0});
    std::byte* h = header_.data();
    put32(h + kHMagic, kMessageMagic);
    put16(h + kHVersion, kMessageVersion);
    h[kHKind] = static_cast<std::byte>(plan_.kind);
    h[kHCodec] = static_cast<std::byte>(plan_.codec);
    put16(h + kHBlock,
          static_cast<uint16_t>(plan_.codec == Codec::TOPK ? plan_.sparse.chunk : kBlock));
    h[kHFlags] = static_cast<std::byte>(try_zstd_ ? kHeaderFlagZstd : 0);
    put32(h + kHStream, key_.stream);
    put64(h + kHNumel, plan_.numel);
    put64(h + kHFingerprint, plan_.fingerprint);
    put64(h + kHRound, key_.round);
    put64(h + kHNode, key_.node_id);
    put32(h + kHChunks, chunk_count_);
    put32(h + kHSparse, sparse_field(plan_));
    header_checksum_ = header_checksum(h);
    put64(h + kHChecksum, header_checksum_);

    if (try_zstd_) {
        zstd_ = std::make_unique<Zstd>();
        zstd_->cctx = ZSTD_createCCtx();
        if (zstd_->cctx == nullptr) throw Error("message encoder: cannot create a zstd context");
    }
}

MessageEncoder::~MessageEncoder() = default;

bool MessageEncoder::next_chunk(std::vector<std::byte>& out) {
    if (segment_ >= plan_.segments.size()) return false;
    const Segment& seg = plan_.segments[segment_];
    const uint64_t first = element_;
    const uint64_t count = std::min(max_chunk_elements(seg.codec, plan_.sparse), seg.numel - first);
    const size_t raw = range_bytes(plan_, seg, count);
    if (raw > kMaxChunkBytes) throw Error("message encoder: chunk above the cap");

    out.resize(kChunkHeaderBytes + raw);
    std::byte* payload = out.data() + kChunkHeaderBytes;
    const std::span<const float> x(source_ + seg.offset + first, count);
    const std::span<std::byte> bytes(payload, raw);
    if (seg.codec == Codec::TOPK && residual_ != nullptr) {
        sparse_encode_with_feedback(plan_.sparse, feedback_decay_, x,
                                    std::span<float>(residual_ + seg.offset + first, count),
                                    seg.first_index + first, key_, bytes);
    } else if (seg.codec == Codec::TOPK) {
        sparse_encode(plan_.sparse, x, seg.first_index + first, key_, bytes);
    } else if (residual_ != nullptr) {
        encode_with_feedback(seg.codec, x, std::span<float>(residual_ + seg.offset + first, count),
                             seg.first_index + first, key_, bytes);
    } else {
        encode(seg.codec, x, seg.first_index + first, key_, bytes);
    }

    size_t payload_len = raw;
    uint8_t flags = 0;
    if (try_zstd_) {
        zbuf_.resize(ZSTD_compressBound(raw));
        const size_t z =
            ZSTD_compressCCtx(zstd_->cctx, zbuf_.data(), zbuf_.size(), payload, raw, kZstdLevel);
        // Compression pays only if it saves at least 5%.
        if (!ZSTD_isError(z) && z * 20 <= raw * 19) {
            std::memcpy(payload, zbuf_.data(), z);
            payload_len = z;
            flags = kChunkFlagZstd;
            out.resize(kChunkHeaderBytes + z);
        }
    }

    std::byte* c = out.data();
    std::memset(c, 0, kChunkHeaderBytes);
    put32(c + kCIndex, next_index_);
    put32(c + kCSegment, static_cast<uint32_t>(segment_));
    put64(c + kCFirst, first);
    put64(c + kCCount, count);
    put32(c + kCPayload, static_cast<uint32_t>(payload_len));
    put32(c + kCUncompressed, static_cast<uint32_t>(raw));
    c[kCFlags] = static_cast<std::byte>(flags);
    put64(c + kCChecksum,
          chunk_checksum(c, std::span<const std::byte>(c + kChunkHeaderBytes, payload_len),
                         header_checksum_));

    next_index_++;
    element_ += count;
    if (element_ == seg.numel) {
        segment_++;
        element_ = 0;
    }
    return true;
}

// ---------------------------------------------------------------------------------------------
// Decoder

struct MessageDecoder::Zstd {
    ZSTD_DCtx* dctx = nullptr;
    ~Zstd() { ZSTD_freeDCtx(dctx); }
};

MessageDecoder::MessageDecoder(std::string_view expected_fingerprint,
                               const ParameterManifest& manifest, float* destination,
                               size_t arena_size)
    : expected_fingerprint_(fingerprint_value(expected_fingerprint)),
      manifest_(manifest),
      destination_(destination),
      arena_size_(arena_size) {
    if (expected_fingerprint_ != fingerprint_value(manifest_.fingerprint())) {
        throw Error("message decoder: expected fingerprint " + std::string(expected_fingerprint) +
                    " is not the manifest's " + manifest_.fingerprint());
    }
    if (arena_size_ == 0 || arena_size_ > 2 * manifest_.total()) {
        throw Error("message decoder: arena of " + num(arena_size_) + " floats, the manifest has " +
                    num(manifest_.total()) + " (a sample's arena holds at most 2 a parameter)");
    }
    if (destination_ == nullptr) throw Error("message decoder: no destination arena");
}

MessageDecoder::~MessageDecoder() = default;

void MessageDecoder::accept_header(std::span<const std::byte> bytes) {
    if (failed_)
        throw Error("message decoder: refusing input after an error (" + first_error_ + ")");
    try {
        header_impl(bytes);
    } catch (const std::exception& e) {
        failed_ = true;
        first_error_ = e.what();
        throw;
    }
}

void MessageDecoder::accept_chunk(std::span<const std::byte> bytes) {
    if (failed_)
        throw Error("message decoder: refusing input after an error (" + first_error_ + ")");
    try {
        chunk_impl(bytes);
    } catch (const std::exception& e) {
        failed_ = true;
        first_error_ = e.what();
        throw;
    }
}

void MessageDecoder::header_impl(std::span<const std::byte> bytes) {
    const std::string where = "message header: ";
    if (has_header_) throw Error(where + "a second header; this message already has one");
    if (bytes.size() < kHeaderBytes) {
        throw Error(where + "truncated: " + num(bytes.size()) + " bytes, a header is " +
                    num(kHeaderBytes));
    }
    if (bytes.size() > kHeaderBytes) {
        throw Error(where + num(bytes.size()) + " bytes, a header is exactly " + num(kHeaderBytes) +
                    " (trailing bytes)");
    }
    const std::byte* h = bytes.data();
    const uint32_t magic = get32(h + kHMagic);
    if (magic != kMessageMagic) {
        char buf[64];
        std::snprintf(buf, sizeof buf, "bad magic 0x%08x, expected 0x%08x", magic, kMessageMagic);
        throw Error(where + buf);
    }
    const uint16_t version = get16(h + kHVersion);
    if (version != kMessageVersion) {
        throw Error(where + "unsupported version " + num(version) + ", this node speaks version " +
                    num(kMessageVersion));
    }
    const uint64_t checksum = get64(h + kHChecksum);
    if (checksum != header_checksum(h)) throw Error(where + "header checksum mismatch");
    if (h[kHReserved8] != std::byte{0} ||
        (static_cast<uint8_t>(h[kHFlags]) & ~kHeaderFlagZstd) != 0) {
        throw Error(where + "reserved bits or bytes are not zero");
    }
    const uint8_t kind_byte = static_cast<uint8_t>(h[kHKind]);
    if (kind_byte > static_cast<uint8_t>(PlanKind::Sample)) {
        throw Error(where + "unknown plan kind " + num(kind_byte));
    }
    const PlanKind kind = static_cast<PlanKind>(kind_byte);
    const uint8_t codec_byte = static_cast<uint8_t>(h[kHCodec]);
    Codec codec;
    try {
        codec = codec_from_byte(codec_byte);
    } catch (const Error& e) {
        throw Error(where + "unknown codec " + num(codec_byte) + " (" + e.what() + ")");
    }
    if (!valid_for(kind, codec)) {
        throw Error(where + "codec " + std::string(codec_name(codec)) + " is not valid for a " +
                    std::string(plan_kind_name(kind)) + " message");
    }
    const uint16_t block = get16(h + kHBlock);
    const uint32_t sparse_bits = get32(h + kHSparse);
    SparseFormat sparse;
    if (codec == Codec::TOPK) {
        sparse = SparseFormat{block, sparse_bits & 0xffff, sparse_bits >> 16};
        try {
            check_sparse_format(sparse);
        } catch (const Error& e) {
            throw Error(where + e.what());
        }
    } else if (block != kBlock) {
        throw Error(where + "block size " + num(block) + ", this node uses " + num(kBlock));
    } else if (sparse_bits != 0) {
        throw Error(where + "reserved bits or bytes are not zero");
    }
    const uint64_t numel = get64(h + kHNumel);
    if (numel != arena_size_) {
        throw Error(where + "element count " + num(numel) + " does not match the arena size " +
                    num(arena_size_));
    }
    if (kind != PlanKind::Sample && numel != manifest_.total()) {
        throw Error(where + "a " + std::string(plan_kind_name(kind)) + " message of " + num(numel) +
                    " elements, the manifest has " + num(manifest_.total()));
    }
    const uint64_t fingerprint = get64(h + kHFingerprint);
    if (fingerprint != expected_fingerprint_) {
        throw Error(where + "message for model " + fingerprint_hex(fingerprint) +
                    ", this node runs " + fingerprint_hex(expected_fingerprint_) +
                    " (fingerprint mismatch)");
    }

    MessagePlan plan = kind == PlanKind::Sample ? sample_plan(manifest_, numel)
                                                : make_plan(manifest_, kind, codec, sparse);
    const uint32_t chunks = get32(h + kHChunks);
    const uint64_t units = total_units(plan);
    if (chunks == 0 || chunks > units) {
        throw Error(where + "chunk count " + num(chunks) + " is impossible for " + num(units) +
                    (codec == Codec::TOPK ? " TOPK chunks" : " blocks"));
    }

    header_.kind = kind;
    header_.codec = codec;
    header_.numel = numel;
    header_.fingerprint = fingerprint;
    header_.round = get64(h + kHRound);
    header_.node_id = get64(h + kHNode);
    header_.stream = get32(h + kHStream);
    header_.sparse = plan.sparse;
    header_.zstd = (static_cast<uint8_t>(h[kHFlags]) & kHeaderFlagZstd) != 0;
    header_.chunk_count = chunks;
    header_.checksum = checksum;
    plan_ = std::move(plan);
    has_header_ = true;
}

void MessageDecoder::chunk_impl(std::span<const std::byte> bytes) {
    if (!has_header_) throw Error("message chunk: a chunk before the header");
    if (complete_) {
        throw Error("message chunk: a chunk after completion (all " + num(header_.chunk_count) +
                    " chunks already arrived)");
    }
    const std::string where = "message chunk " + num(next_index_) + ": ";
    if (bytes.size() < kChunkHeaderBytes) {
        throw Error(where + "truncated chunk header: " + num(bytes.size()) + " bytes, need " +
                    num(kChunkHeaderBytes));
    }
    const std::byte* c = bytes.data();
    const uint32_t index = get32(c + kCIndex);
    if (index != next_index_) {
        throw Error(where + "out of order: chunk index " + num(index) + ", expected " +
                    num(next_index_));
    }
    const uint8_t flags = static_cast<uint8_t>(c[kCFlags]);
    bool reserved_zero = (flags & ~kChunkFlagZstd) == 0;
    for (size_t i = kCReserved; i < kCChecksum; i++)
        reserved_zero = reserved_zero && c[i] == std::byte{0};
    if (!reserved_zero) throw Error(where + "reserved bits or bytes are not zero");

    const uint32_t segment = get32(c + kCSegment);
    if (segment >= plan_.segments.size()) {
        throw Error(where + "segment index " + num(segment) + " outside the plan of " +
                    num(plan_.segments.size()) + " segments");
    }
    const Segment& seg = plan_.segments[segment];
    const uint64_t first = get64(c + kCFirst);
    const uint64_t count = get64(c + kCCount);
    if (count == 0) throw Error(where + "empty element range");
    if (first > seg.numel || count > seg.numel - first) {
        throw Error(where + "element range [" + num(first) + ", +" + num(count) +
                    ") outside segment " + num(segment) + " of " + num(seg.numel) + " elements");
    }
    const uint64_t unit = unit_of(plan_, seg);
    if (first % unit != 0 || (count % unit != 0 && first + count != seg.numel)) {
        throw Error(where + "element range [" + num(first) + ", " + num(first + count) +
                    ") is not aligned to blocks of " + num(unit));
    }
    if (segment != segment_ || first != element_) {
        throw Error(where + "covers segment " + num(segment) + " from element " + num(first) +
                    ", expected segment " + num(segment_) + " from element " + num(element_) +
                    " (chunks out of order or missing)");
    }

    const uint32_t payload_len = get32(c + kCPayload);
    const uint32_t uncompressed_len = get32(c + kCUncompressed);
    const bool zstd = (flags & kChunkFlagZstd) != 0;
    if (uncompressed_len > kMaxChunkBytes) {
        throw Error(where + "uncompressed length " + num(uncompressed_len) + " above the cap of " +
                    num(kMaxChunkBytes));
    }
    const size_t expected_len = range_bytes(plan_, seg, count);
    if (uncompressed_len != expected_len) {
        throw Error(where + "payload length " + num(uncompressed_len) + " does not match the " +
                    num(expected_len) + " bytes " + std::string(codec_name(seg.codec)) +
                    " takes for " + num(count) + " elements");
    }
    if (!zstd && payload_len != uncompressed_len) {
        throw Error(where + "payload length " + num(payload_len) +
                    " of an uncompressed chunk is not "
                    "its uncompressed length " +
                    num(uncompressed_len));
    }
    if (zstd && payload_len > kMaxChunkBytes) {
        throw Error(where + "compressed payload length " + num(payload_len) + " above the cap");
    }
    if (zstd && !header_.zstd) {
        throw Error(where + "zstd-compressed although the header says the sender did not use zstd");
    }
    const size_t have = bytes.size() - kChunkHeaderBytes;
    if (have < payload_len) {
        throw Error(where + "truncated chunk: payload of " + num(have) + " bytes, header says " +
                    num(payload_len));
    }
    if (have > payload_len) {
        throw Error(where + num(have - payload_len) + " trailing bytes after the payload");
    }
    const std::span<const std::byte> payload = bytes.subspan(kChunkHeaderBytes, payload_len);
    if (get64(c + kCChecksum) != chunk_checksum(c, payload, header_.checksum)) {
        throw Error(where + "chunk checksum mismatch");
    }

    std::span<const std::byte> encoded = payload;
    if (zstd) {
        if (!zstd_) {
            zstd_ = std::make_unique<Zstd>();
            zstd_->dctx = ZSTD_createDCtx();
            if (zstd_->dctx == nullptr) throw Error(where + "cannot create a zstd context");
        }
        if (scratch_.size() < uncompressed_len) scratch_.resize(uncompressed_len);
        const size_t got = ZSTD_decompressDCtx(zstd_->dctx, scratch_.data(), uncompressed_len,
                                               payload.data(), payload.size());
        if (ZSTD_isError(got)) {
            throw Error(where + "zstd failure: " + ZSTD_getErrorName(got));
        }
        if (got != uncompressed_len) {
            throw Error(where + "zstd decompressed size mismatch: " + num(got) +
                        " bytes, header says " + num(uncompressed_len));
        }
        encoded = std::span<const std::byte>(scratch_.data(), uncompressed_len);
    }
    try {
        const std::span<float> out(destination_ + seg.offset + first, count);
        if (seg.codec == Codec::TOPK) {
            sparse_decode(plan_.sparse, encoded, out);
        } else {
            decode(seg.codec, encoded, out);
        }
    } catch (const Error& e) {
        throw Error(where + e.what());
    }

    next_index_++;
    element_ += count;
    if (element_ == seg.numel) {
        segment_++;
        element_ = 0;
    }
    const bool covered = segment_ == plan_.segments.size();
    if (covered && next_index_ != header_.chunk_count) {
        throw Error(where + "chunk count mismatch: the message is covered after " +
                    num(next_index_) + " chunks, the header announced " + num(header_.chunk_count));
    }
    if (!covered && next_index_ == header_.chunk_count) {
        throw Error(where + "chunk count mismatch: the header announced " +
                    num(header_.chunk_count) + " chunks, which end before the message is covered");
    }
    complete_ = covered;
}

// ---------------------------------------------------------------------------------------------
// Whole messages

size_t EncodedMessage::bytes() const {
    size_t total = header.size();
    for (const std::vector<std::byte>& chunk : chunks) total += chunk.size();
    return total;
}

EncodedMessage encode_to_end(MessageEncoder& encoder) {
    EncodedMessage message;
    message.header = encoder.header_bytes();
    message.chunks.reserve(encoder.chunk_count());
    std::vector<std::byte> chunk;
    while (encoder.next_chunk(chunk)) message.chunks.push_back(chunk);
    return message;
}

void decode_to_end(std::span<const std::byte> header,
                   std::span<const std::vector<std::byte>> chunks, MessageDecoder& decoder) {
    decoder.accept_header(header);
    for (const std::vector<std::byte>& chunk : chunks) decoder.accept_chunk(chunk);
    if (!decoder.complete()) {
        throw Error("message: truncated, ended after " + num(chunks.size()) + " of " +
                    num(decoder.header().chunk_count) + " chunks (incomplete)");
    }
}

std::vector<std::vector<std::byte>> encode_message(const MessagePlan& plan, const RoundingKey& key,
                                                   const float* source, float* residual,
                                                   bool try_zstd) {
    MessageEncoder encoder(plan, key, source, residual, try_zstd);
    EncodedMessage message = encode_to_end(encoder);
    std::vector<std::vector<std::byte>> parts;
    parts.reserve(message.chunks.size() + 1);
    parts.push_back(std::move(message.header));
    for (std::vector<std::byte>& chunk : message.chunks) parts.push_back(std::move(chunk));
    return parts;
}

void decode_message(const std::vector<std::vector<std::byte>>& parts,
                    std::string_view expected_fingerprint, const ParameterManifest& manifest,
                    float* destination, size_t arena_size) {
    if (parts.empty()) throw Error("message: no header");
    MessageDecoder decoder(expected_fingerprint, manifest, destination, arena_size);
    decode_to_end(parts[0], std::span(parts).subspan(1), decoder);
}

}  // namespace starling::codec
