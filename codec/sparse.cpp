// TOPK (sparse.h). Byte layout and arithmetic: README.md, "TOPK".
//
// Each chunk is coded on its own, so the bytes do not depend on the thread count or on how a span
// is cut at chunk boundaries. The kept set is a pure function of the values: the threshold is the
// keep-th largest magnitude (nth_element finds it in linear time whatever order it visits), every
// magnitude above it is kept, and ties at it are kept in index order until the count is reached,
// so the positions come out sorted, as Elias-Fano wants them.
#include "codec/sparse.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "codec/parallel_coding.h"
#include "common/error.h"
#include "common/rounding_noise.h"
#include "common/stochastic_rounding.h"

namespace starling::codec {

namespace {

constexpr size_t kRangeBytes = 8;  // per chunk: the smallest and the largest kept magnitude
constexpr uint32_t kAbsMask = 0x7fffffffu;
constexpr uint32_t kInfBits = 0x7f800000u;

// The sizes of one chunk's fields. Positions are Elias-Fano coded: each keeps its low_bits low
// bits verbatim, and its high part h (position >> low_bits) sets bit h + i of the upper bitmap for
// the i-th position in increasing order.
struct ChunkShape {
    uint32_t len = 0;
    uint32_t keep = 0;
    uint32_t low_bits = 0;
    uint32_t upper_bits = 0;
    size_t bytes = 0;
};

ChunkShape chunk_shape(const SparseFormat& f, size_t len) {
    ChunkShape s;
    s.len = static_cast<uint32_t>(len);
    s.keep = sparse_keep(f, len);
    s.low_bits = s.len > s.keep ? static_cast<uint32_t>(std::bit_width(s.len / s.keep)) - 1 : 0;
    s.upper_bits = s.keep + ((s.len - 1) >> s.low_bits) + 1;
    const uint64_t bits = uint64_t(s.keep) * (s.low_bits + f.value_bits) + s.upper_bits;
    s.bytes = kRangeBytes + static_cast<size_t>((bits + 7) / 8);
    return s;
}

// Bits packed least significant first, fields back to back.
class BitWriter {
public:
    explicit BitWriter(std::byte* out) : out_(out) {}
    void put(uint32_t value, uint32_t bits) {  // bits <= 32; value < 2^bits
        acc_ |= uint64_t(value) << fill_;
        fill_ += bits;
        while (fill_ >= 8) {
            *out_++ = static_cast<std::byte>(acc_);
            acc_ >>= 8;
            fill_ -= 8;
        }
    }
    void zeros(uint64_t count) {
        for (; count > 32; count -= 32) put(0, 32);
        put(0, static_cast<uint32_t>(count));
    }
    void finish() {
        if (fill_ > 0) *out_ = static_cast<std::byte>(acc_);
    }

private:
    std::byte* out_;
    uint64_t acc_ = 0;
    uint32_t fill_ = 0;
};

class BitReader {
public:
    BitReader(const std::byte* in, const std::byte* end) : in_(in), end_(end) {}
    uint32_t get(uint32_t bits) {  // bits <= 32
        while (fill_ < bits) {
            // The shapes size every chunk to its bits; past the end reads zeros, never memory.
            const uint64_t byte = in_ < end_ ? static_cast<uint64_t>(*in_++) : 0;
            acc_ |= byte << fill_;
            fill_ += 8;
        }
        const uint32_t value = static_cast<uint32_t>(acc_ & ((uint64_t(1) << bits) - 1));
        acc_ >>= bits;
        fill_ -= bits;
        return value;
    }
    // Whether the bits left in the last byte read are all zero.
    bool padding_clear() const { return acc_ == 0 && in_ == end_; }

private:
    const std::byte* in_;
    const std::byte* end_;
    uint64_t acc_ = 0;
    uint32_t fill_ = 0;
};

enum class Problem : uint8_t {
    None,
    NonFinite,
    BadRange,
    TooManyPositions,
    PositionOutOfRange,
    PositionOutOfOrder,
    TooFewPositions,
    Padding,
};

std::string problem_text(Problem p, uint32_t keep) {
    switch (p) {
        case Problem::None: return "no problem";
        case Problem::NonFinite: return "holds a NaN or Inf";
        case Problem::BadRange:
            return "has a magnitude range that is NaN, Inf, negative or inverted";
        case Problem::TooManyPositions:
            return "marks more than its " + std::to_string(keep) + " positions";
        case Problem::PositionOutOfRange: return "has a position past its end";
        case Problem::PositionOutOfOrder: return "has a position repeated or out of order";
        case Problem::TooFewPositions:
            return "marks fewer than its " + std::to_string(keep) + " positions";
        case Problem::Padding: return "has non-zero padding bits";
    }
    return "unknown problem";
}

// The magnitude a level decodes to: lo + j * step, never past hi (lo + m * step can round above
// hi, even to Inf where hi is near FLT_MAX). The encoder's residual uses the same value.
float level_magnitude(float lo, float hi, float step, uint32_t level) {
    return std::min(lo + mul_rn(static_cast<float>(level), step), hi);
}

uint32_t max_level(const SparseFormat& f) { return (uint32_t(1) << (f.value_bits - 1)) - 1; }

struct EncodeScratch {
    std::vector<float> x;
    std::vector<uint32_t> mags;
    std::vector<uint32_t> select;
    std::vector<uint32_t> positions;
};

struct EncodeArgs {
    const SparseFormat& format;
    float decay;
    const float* delta;
    float* residual;  // null: no feedback
    uint64_t first_index;
    PhiloxStream noise;
    std::byte* out;
};

// Encodes the chunk of len values at element offset `start` (and byte offset `at`).
Problem encode_chunk(const EncodeArgs& a, const ChunkShape& s, size_t start, size_t at) {
    thread_local EncodeScratch sc;
    sc.x.resize(s.len);
    sc.mags.resize(s.len);
    for (uint32_t i = 0; i < s.len; i++) {
        const float d = a.delta[start + i];
        const float x = a.residual != nullptr ? d + mul_rn(a.decay, a.residual[start + i]) : d;
        const uint32_t mag = std::bit_cast<uint32_t>(x) & kAbsMask;
        if (mag >= kInfBits) return Problem::NonFinite;
        sc.x[i] = x;
        sc.mags[i] = mag;
    }
    // Finite magnitudes order as their bit patterns do.
    sc.select.assign(sc.mags.begin(), sc.mags.end());
    const auto kth = sc.select.begin() + (s.keep - 1);
    std::nth_element(sc.select.begin(), kth, sc.select.end(), std::greater<>());
    const uint32_t threshold = *kth;
    const uint32_t largest = *std::max_element(sc.select.begin(), kth + 1);
    uint32_t ties =
        s.keep - static_cast<uint32_t>(std::count_if(sc.select.begin(), kth,
                                                     [&](uint32_t m) { return m > threshold; }));
    sc.positions.clear();
    for (uint32_t i = 0; i < s.len; i++) {
        if (sc.mags[i] > threshold) {
            sc.positions.push_back(i);
        } else if (sc.mags[i] == threshold && ties > 0) {
            sc.positions.push_back(i);
            ties--;
        }
    }

    const float lo = std::bit_cast<float>(threshold);
    const float hi = std::bit_cast<float>(largest);
    const uint32_t levels = max_level(a.format);
    const float step = (hi - lo) / static_cast<float>(levels);
    std::byte* out = a.out + at;
    std::memcpy(out, &threshold, 4);
    std::memcpy(out + 4, &largest, 4);
    BitWriter w(out + kRangeBytes);
    const uint32_t low_mask = (uint32_t(1) << s.low_bits) - 1;
    for (uint32_t p : sc.positions) w.put(p & low_mask, s.low_bits);
    uint64_t bit = 0;
    for (uint32_t i = 0; i < s.keep; i++) {
        const uint64_t set = (sc.positions[i] >> s.low_bits) + i;
        w.zeros(set - bit);
        w.put(1, 1);
        bit = set + 1;
    }
    w.zeros(s.upper_bits - bit);
    for (uint32_t p : sc.positions) {
        const float x = sc.x[p];
        const float mag = std::bit_cast<float>(sc.mags[p]);
        uint32_t level = 0;
        if (step > 0.0f) {
            // The level in fixed point with 16 fraction bits, rounded up with probability equal
            // to the fraction (common/stochastic_rounding.h describes the same scheme for Q8).
            const int32_t t = round_to_int((mag - lo) / step * 65536.0f);
            const int32_t r =
                static_cast<int32_t>(rounding_bits(a.noise, a.first_index + start + p));
            level = static_cast<uint32_t>(std::clamp((t + r) >> 16, 0, int32_t(levels)));
        }
        const bool negative = std::signbit(x);
        w.put((level << 1) | uint32_t(negative), a.format.value_bits);
        if (a.residual != nullptr) {
            const float sent = level_magnitude(lo, hi, step, level);
            a.residual[start + p] = x - (negative ? -sent : sent);
        }
    }
    w.finish();
    if (a.residual != nullptr) {
        size_t next = 0;
        for (uint32_t i = 0; i < s.len; i++) {
            if (next < sc.positions.size() && sc.positions[next] == i) {
                next++;
            } else {
                a.residual[start + i] = sc.x[i];
            }
        }
    }
    return Problem::None;
}

Problem decode_chunk(const SparseFormat& f, const ChunkShape& s, const std::byte* in, float* out) {
    thread_local std::vector<uint32_t> positions;
    uint32_t lo_bits = 0, hi_bits = 0;
    std::memcpy(&lo_bits, in, 4);
    std::memcpy(&hi_bits, in + 4, 4);
    // Non-negative (no sign bit), finite and lo <= hi; as bit patterns these order as the values.
    if (lo_bits >= kInfBits || hi_bits >= kInfBits || lo_bits > hi_bits) return Problem::BadRange;
    const float lo = std::bit_cast<float>(lo_bits);
    const float hi = std::bit_cast<float>(hi_bits);
    const float step = (hi - lo) / static_cast<float>(max_level(f));

    BitReader r(in + kRangeBytes, in + s.bytes);
    positions.resize(s.keep);
    for (uint32_t i = 0; i < s.keep; i++) positions[i] = r.get(s.low_bits);
    uint32_t found = 0;
    for (uint32_t bit = 0; bit < s.upper_bits; bit++) {
        if (r.get(1) == 0) continue;
        if (found == s.keep) return Problem::TooManyPositions;
        const uint64_t p = (uint64_t(bit - found) << s.low_bits) | positions[found];
        if (p >= s.len) return Problem::PositionOutOfRange;
        if (found > 0 && p <= positions[found - 1]) return Problem::PositionOutOfOrder;
        positions[found++] = static_cast<uint32_t>(p);
    }
    if (found < s.keep) return Problem::TooFewPositions;
    std::fill(out, out + s.len, 0.0f);
    for (uint32_t i = 0; i < s.keep; i++) {
        const uint32_t code = r.get(f.value_bits);
        const float mag = level_magnitude(lo, hi, step, code >> 1);
        out[positions[i]] = (code & 1) != 0 ? -mag : mag;
    }
    if (!r.padding_clear()) return Problem::Padding;
    return Problem::None;
}

// Runs chunk(c, shape, element start, byte start) for every chunk of n values, in parallel for
// large spans, and throws for the first chunk that reports a problem.
template <typename Chunk>
void for_each_chunk(const SparseFormat& f, size_t n, const char* what, const Chunk& chunk) {
    const size_t whole = n / f.chunk;
    const size_t count = whole + (n % f.chunk != 0 ? 1 : 0);
    const ChunkShape full = chunk_shape(f, f.chunk);
    const ChunkShape tail = n % f.chunk != 0 ? chunk_shape(f, n % f.chunk) : full;
    auto run = [&](size_t c) {
        return chunk(c < whole ? full : tail, c * f.chunk, c * full.bytes);
    };
    std::vector<Problem> problems;
    size_t bad = count;
    if (code_in_parallel(n)) {
        problems.assign(count, Problem::None);
        const ptrdiff_t chunks = static_cast<ptrdiff_t>(count);
#pragma omp parallel for schedule(static)
        for (ptrdiff_t c = 0; c < chunks; c++) problems[size_t(c)] = run(size_t(c));
        for (size_t c = 0; c < count && bad == count; c++) {
            if (problems[c] != Problem::None) bad = c;
        }
    } else {
        problems.assign(1, Problem::None);
        for (size_t c = 0; c < count && bad == count; c++) {
            problems[0] = run(c);
            if (problems[0] != Problem::None) bad = c;
        }
    }
    if (bad == count) return;
    const Problem p = problems.size() == 1 ? problems[0] : problems[bad];
    const ChunkShape& s = bad < whole ? full : tail;
    const size_t first = bad * f.chunk;
    throw Error(std::string(what) + ": TOPK chunk " + std::to_string(bad) + " (elements " +
                std::to_string(first) + " to " + std::to_string(first + s.len - 1) + ") " +
                problem_text(p, s.keep));
}

void check_size(const char* what, const SparseFormat& f, size_t n, size_t bytes) {
    const size_t expected = sparse_encoded_bytes(f, n);
    if (bytes != expected) {
        throw Error(std::string(what) + ": " + std::to_string(bytes) + " bytes of TOPK data for " +
                    std::to_string(n) + " values, which take " + std::to_string(expected));
    }
}

void encode_impl(const SparseFormat& f, float decay, std::span<const float> delta, float* residual,
                 uint64_t first_index, const RoundingKey& key, std::span<std::byte> out) {
    check_size("TOPK encode", f, delta.size(), out.size());
    const EncodeArgs args{f,         decay,       delta.data(),
                          residual,  first_index, philox_stream(key.node_id, key.round, key.stream),
                          out.data()};
    for_each_chunk(f, delta.size(), "TOPK encode",
                   [&](const ChunkShape& s, size_t start, size_t at) {
                       return encode_chunk(args, s, start, at);
                   });
}

}  // namespace

void check_sparse_format(const SparseFormat& f) {
    if (f.chunk < kSparseMinChunk || f.chunk > kSparseMaxChunk) {
        throw Error("TOPK chunk of " + std::to_string(f.chunk) + " values is outside [" +
                    std::to_string(kSparseMinChunk) + ", " + std::to_string(kSparseMaxChunk) + "]");
    }
    if (f.keep < 1 || f.keep > f.chunk) {
        throw Error("TOPK keeps " + std::to_string(f.keep) + " values of a chunk of " +
                    std::to_string(f.chunk) + "; it must keep between 1 and the whole chunk");
    }
    if (f.value_bits < kSparseMinValueBits || f.value_bits > kSparseMaxValueBits) {
        throw Error("TOPK values of " + std::to_string(f.value_bits) + " bits; they take 2 to 8");
    }
}

SparseFormat sparse_format(uint32_t chunk, double density, uint32_t value_bits) {
    if (!(density > 0.0 && density <= 1.0)) {
        throw Error("TOPK density " + std::to_string(density) + " is not in (0, 1]");
    }
    const double kept = std::max(1.0, std::round(density * chunk));
    SparseFormat f{chunk, static_cast<uint32_t>(std::min<double>(kept, chunk)), value_bits};
    check_sparse_format(f);
    return f;
}

uint32_t sparse_keep(const SparseFormat& f, size_t len) {
    return static_cast<uint32_t>((uint64_t(f.keep) * len + f.chunk - 1) / f.chunk);
}

size_t sparse_encoded_bytes(const SparseFormat& f, size_t n) {
    check_sparse_format(f);
    if (n > std::numeric_limits<size_t>::max() / 8) {
        throw Error("TOPK: " + std::to_string(n) + " values is too many to encode");
    }
    const size_t tail = n % f.chunk;
    return n / f.chunk * chunk_shape(f, f.chunk).bytes +
           (tail != 0 ? chunk_shape(f, tail).bytes : 0);
}

void sparse_encode(const SparseFormat& f, std::span<const float> x, uint64_t first_index,
                   const RoundingKey& key, std::span<std::byte> out) {
    encode_impl(f, 1.0f, x, nullptr, first_index, key, out);
}

void sparse_encode_with_feedback(const SparseFormat& f, float decay, std::span<const float> delta,
                                 std::span<float> residual, uint64_t first_index,
                                 const RoundingKey& key, std::span<std::byte> out) {
    if (residual.size() != delta.size()) {
        throw Error("TOPK encode: residual of " + std::to_string(residual.size()) +
                    " values for a delta of " + std::to_string(delta.size()));
    }
    if (!(decay >= 0.0f && decay <= 1.0f)) {
        throw Error("TOPK encode: feedback decay " + std::to_string(decay) + " is not in [0, 1]");
    }
    encode_impl(f, decay, delta, residual.data(), first_index, key, out);
}

void sparse_decode(const SparseFormat& f, std::span<const std::byte> in, std::span<float> out) {
    check_size("TOPK decode", f, out.size(), in.size());
    for_each_chunk(f, out.size(), "TOPK decode", [&](const ChunkShape& s, size_t start, size_t at) {
        return decode_chunk(f, s, in.data() + at, out.data() + start);
    });
}

}  // namespace starling::codec
