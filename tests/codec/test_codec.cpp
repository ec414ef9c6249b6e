// Element codecs (codec/codec.h): Philox against the Random123 answers, byte layouts
// against hand-computed bytes, the vectorized encoder against a per-element reference built from
// the documented counter mapping, error bounds, unbiasedness, reproducibility, error feedback and
// hostile input.
#include <catch2/catch.hpp>

#include <algorithm>
#include <bit>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "common/error.h"
#include "kernels/cpu/cpu_ops.h"
#include "common/random.h"
#include "common/stochastic_rounding.h"
#include "codec/codec.h"
#include "common/rounding_noise.h"
#include "tests/support/random.h"

using namespace starling;
using namespace starling::codec;
using starling::test::random_vector;

namespace {

using Bytes = std::vector<std::byte>;

Bytes encode_new(Codec c, const std::vector<float>& x, uint64_t first, const RoundingKey& key) {
    Bytes out(encoded_bytes(c, x.size()));
    encode(c, x, first, key, out);
    return out;
}

std::vector<float> decode_new(Codec c, const Bytes& in, size_t n) {
    std::vector<float> out(n);
    decode(c, in, out);
    return out;
}

Bytes hex(std::initializer_list<unsigned> values) {
    Bytes b;
    for (unsigned v : values) {
        b.push_back(std::byte(v));
    }
    return b;
}

Bytes slice(const Bytes& b, size_t from, size_t to) {
    return Bytes(b.begin() + ptrdiff_t(from), b.begin() + ptrdiff_t(to));
}

// Layout of the block codecs: per block a little-endian fp32 scale, then the payload.
size_t block_stride(Codec c) { return c == Codec::Q8 ? 4 + 64 : 4 + 32; }

float scale_of(Codec c, const Bytes& b, size_t block) {
    float s;
    std::memcpy(&s, b.data() + block * block_stride(c), 4);
    return s;
}

float qmax_of(Codec c) { return c == Codec::Q8 ? 127.0f : 7.0f; }

// The 16 rounding bits of element i, straight from the documented mapping: Philox4x32-10 keyed by
// the halves of mix64(node_id), counter (round lo, round hi ^ g hi, stream, g lo) with g = i / 8,
// word (i % 8) / 2, its low half for even i and its high half for odd i.
uint32_t reference_bits(const RoundingKey& key, uint64_t i) {
    const uint64_t k = mix64(key.node_id);
    const uint64_t g = i / 8;
    const Philox4x32 counter{{uint32_t(key.round), uint32_t(key.round >> 32) ^ uint32_t(g >> 32),
                              key.stream, uint32_t(g)}};
    const uint32_t word = philox4x32_10(counter, uint32_t(k), uint32_t(k >> 32)).v[(i % 8) / 2];
    return i % 2 == 0 ? word & 0xffffu : word >> 16;
}

// Element by element, from the shared per-element helpers and the documented layout.
Bytes reference_encode(Codec c, const std::vector<float>& x, uint64_t first,
                       const RoundingKey& key) {
    Bytes out;
    auto put = [&](const void* p, size_t n) {
        const auto* b = static_cast<const std::byte*>(p);
        out.insert(out.end(), b, b + n);
    };
    if (c == Codec::F32) {
        put(x.data(), 4 * x.size());
    } else if (c == Codec::BF16SR) {
        for (size_t i = 0; i < x.size(); i++) {
            const uint16_t h =
                bf16_round_sr(std::bit_cast<uint32_t>(x[i]), reference_bits(key, first + i));
            put(&h, 2);
        }
    } else {
        const float qmax = qmax_of(c);
        for (size_t start = 0; start < x.size(); start += 64) {
            const size_t len = std::min<size_t>(64, x.size() - start);
            float m = 0.0f;
            for (size_t i = 0; i < len; i++) {
                m = std::max(m, std::fabs(x[start + i]));
            }
            const QuantBlock qb = quant_block(m, qmax);
            put(&qb.scale, 4);
            std::vector<int> q(len);
            for (size_t i = 0; i < len; i++) {
                q[i] = quantize_sr(x[start + i], qb, reference_bits(key, first + start + i),
                                   int(qmax));
            }
            if (c == Codec::Q8) {
                for (int v : q) {
                    out.push_back(std::byte(uint8_t(int8_t(v))));
                }
            } else {
                for (size_t i = 0; i < len; i += 2) {
                    const unsigned lo = unsigned(q[i]) & 15u;
                    const unsigned hi = i + 1 < len ? unsigned(q[i + 1]) & 15u : 0u;
                    out.push_back(std::byte(lo | hi << 4));
                }
            }
        }
    }
    return out;
}

// Blocks of every kind: normal, all zero, huge, tiny, all negative, mixed signs, a lone spike,
// subnormal, then a short last block.
std::vector<float> assorted_values() {
    std::vector<float> x;
    auto block = [&](uint64_t seed, double lo, double hi, size_t len = 64) {
        auto v = random_vector<float>(len, seed, lo, hi);
        x.insert(x.end(), v.begin(), v.end());
    };
    block(1, -1.0, 1.0);
    x.insert(x.end(), 64, 0.0f);
    block(2, -1e30, 1e30);
    block(3, -1e-30, 1e-30);
    block(4, -5.0, -1.0);
    block(5, -3e-3, 2e-3);
    x.insert(x.end(), 63, 1e-3f);
    x.push_back(-7.0f);
    block(6, -1e-40, 1e-40);  // subnormal: the scale underflows past 2^-64
    block(7, 0.0, 1e-44);     // max / 127 underflows to 0: smallest subnormal scale
    x.insert(x.end(), 63, -std::ldexp(150.0f, -149));
    x.push_back(std::ldexp(190.0f, -149));  // 190 / 127 = 1.496 units: the scale rounds up to 2
    block(8, -2.0, 2.0, 37);
    return x;
}

// Magnitude of one bf16 ulp at x (finite x).
double bf16_ulp(float x) {
    const int e = int((std::bit_cast<uint32_t>(x) >> 23) & 0xff);
    return std::ldexp(1.0, std::max(e, 1) - 127 - 7);
}

std::string error_of(const std::function<void()>& f) {
    try {
        f();
    } catch (const Error& e) {
        return e.what();
    }
    return "(no error)";
}

const RoundingKey kKey{0x0123456789abcdefULL, 0x500000007ULL, 11};

}  // namespace

TEST_CASE("Philox4x32-10 gives the Random123 known answers", "[codec][philox]") {
    const Philox4x32 zero = philox4x32_10(Philox4x32{{0, 0, 0, 0}}, 0, 0);
    CHECK(zero.v[0] == 0x6627e8d5u);
    CHECK(zero.v[1] == 0xe169c58du);
    CHECK(zero.v[2] == 0xbc57ac4cu);
    CHECK(zero.v[3] == 0x9b00dbd8u);
    const uint32_t ones = 0xffffffffu;
    const Philox4x32 full = philox4x32_10(Philox4x32{{ones, ones, ones, ones}}, ones, ones);
    CHECK(full.v[0] == 0x408f276du);
    CHECK(full.v[1] == 0x41c83b0eu);
    CHECK(full.v[2] == 0xa20bc7c6u);
    CHECK(full.v[3] == 0x6d5451fdu);
    const Philox4x32 pi = philox4x32_10(
        Philox4x32{{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}}, 0xa4093822u, 0x299f31d0u);
    CHECK(pi.v[0] == 0xd16cfe09u);
    CHECK(pi.v[1] == 0x94fdccebu);
    CHECK(pi.v[2] == 0x5001e420u);
    CHECK(pi.v[3] == 0x24126ea1u);
}

TEST_CASE("rounding_noise.h draws 16 bits per element, eight elements per Philox call",
          "[codec][philox]") {
    for (RoundingKey key : {kKey, RoundingKey{7, 3, 0}}) {
        const PhiloxStream s = philox_stream(key.node_id, key.round, key.stream);
        for (uint64_t base : {uint64_t(0), uint64_t(1000003), (uint64_t(1) << 35) - 8,
                              (uint64_t(1) << 35), (uint64_t(1) << 40) + 24}) {
            const uint64_t g = base / 8;
            const Philox4x32 words = rounding_words(s, g);
            for (uint64_t i = g * 8; i < g * 8 + 8; i++) {
                INFO("round " << key.round << " element " << i);
                const uint32_t word = words.v[(i % 8) / 2];
                CHECK(rounding_bits(s, i) == (i % 2 == 0 ? word & 0xffffu : word >> 16));
                CHECK(rounding_bits(s, i) == reference_bits(key, i));
                CHECK(rounding_bits(s, i) < 0x10000u);
            }
        }
        // The index's high half reaches the counter: groups 2^32 apart draw different words.
        CHECK(rounding_words(s, 5).v[0] != rounding_words(s, 5 + (uint64_t(1) << 32)).v[0]);
    }
}

TEST_CASE("names, codec bytes and encoded sizes", "[codec]") {
    CHECK(codec_name(Codec::F32) == "F32");
    CHECK(codec_name(Codec::BF16SR) == "BF16SR");
    CHECK(codec_name(Codec::Q8) == "Q8");
    CHECK(codec_name(Codec::Q4) == "Q4");
    for (uint8_t b = 0; b < 4; b++) {
        CHECK(uint8_t(codec_from_byte(b)) == b);
    }
    // 64 values: one block; 65: a second block of one value; 0: nothing.
    CHECK(encoded_bytes(Codec::F32, 65) == 260);
    CHECK(encoded_bytes(Codec::BF16SR, 65) == 130);
    CHECK(encoded_bytes(Codec::Q8, 0) == 0);
    CHECK(encoded_bytes(Codec::Q8, 64) == 68);
    CHECK(encoded_bytes(Codec::Q8, 65) == 68 + 4 + 1);
    CHECK(encoded_bytes(Codec::Q4, 64) == 36);
    CHECK(encoded_bytes(Codec::Q4, 65) == 36 + 4 + 1);
    CHECK(encoded_bytes(Codec::Q4, 67) == 36 + 4 + 2);
    // 1.0625 and 0.5625 bytes per value.
    CHECK(encoded_bytes(Codec::Q8, 64 * 1000) == 68000);
    CHECK(encoded_bytes(Codec::Q4, 64 * 1000) == 36000);
    // Nothing to do is not an error.
    for (Codec c : {Codec::F32, Codec::BF16SR, Codec::Q8, Codec::Q4}) {
        CHECK_NOTHROW(encode(c, {}, 64, kKey, {}));
        CHECK_NOTHROW(decode(c, {}, {}));
    }
}

TEST_CASE("Q8 bytes of a hand-made block", "[codec][layout]") {
    // Scale 127 / 127 = 1, so integers are exact levels, which stochastic rounding keeps:
    // floor(k + u) = k for every u in [0, 1).
    std::vector<float> x = {127, -127, 1, -1, 0, 5, -100, 64};
    for (size_t i = x.size(); i < 64; i++) {
        x.push_back(float(int(i * 7 % 255) - 127));
    }
    const Bytes b = encode_new(Codec::Q8, x, 0, kKey);
    REQUIRE(b.size() == 68);
    CHECK(slice(b, 0, 4) == hex({0x00, 0x00, 0x80, 0x3F}));  // 1.0f
    CHECK(slice(b, 4, 12) == hex({0x7F, 0x81, 0x01, 0xFF, 0x00, 0x05, 0x9C, 0x40}));
    for (size_t i = 8; i < 64; i++) {
        INFO("element " << i);
        CHECK(int8_t(b[4 + i]) == int(i * 7 % 255) - 127);
    }
    const std::vector<float> y = decode_new(Codec::Q8, b, 64);
    CHECK(y == x);
}

TEST_CASE("Q4 bytes of a hand-made block: low nibble first, two's complement", "[codec][layout]") {
    // Block 0: scale 3.5 / 7 = 0.5, levels exact. Block 1: three values, scale 1.75 / 7 = 0.25,
    // an odd count, so the last byte's high nibble is padding (0).
    const std::vector<int> levels = {7, -7, 1, -1, 0, 3, -3, 2};
    std::vector<float> x;
    for (int q : levels) {
        x.push_back(0.5f * float(q));
    }
    for (size_t i = x.size(); i < 64; i++) {
        x.push_back(0.5f * float(int(i * 5 % 15) - 7));
    }
    x.insert(x.end(), {1.75f, -0.5f, 0.25f});
    const Bytes b = encode_new(Codec::Q4, x, 0, kKey);
    REQUIRE(b.size() == 36 + 4 + 2);
    CHECK(slice(b, 0, 4) == hex({0x00, 0x00, 0x00, 0x3F}));  // 0.5f
    // (7, -7) -> 0x97, (1, -1) -> 0xF1, (0, 3) -> 0x30, (-3, 2) -> 0x2D
    CHECK(slice(b, 4, 8) == hex({0x97, 0xF1, 0x30, 0x2D}));
    for (size_t i = 8; i < 64; i += 2) {
        INFO("elements " << i << ", " << i + 1);
        const unsigned lo = unsigned(int(i * 5 % 15) - 7) & 15u;
        const unsigned hi = unsigned(int((i + 1) * 5 % 15) - 7) & 15u;
        CHECK(unsigned(b[4 + i / 2]) == (lo | hi << 4));
    }
    CHECK(slice(b, 36, 42) == hex({0x00, 0x00, 0x80, 0x3E, 0xE7, 0x01}));  // 0.25f; (7,-2), (1,pad)
    const std::vector<float> y = decode_new(Codec::Q4, b, x.size());
    CHECK(y == x);
}

TEST_CASE("BF16SR and F32 bytes", "[codec][layout]") {
    // Values already bf16 (low half zero) are kept exactly: no carry can reach the high half.
    const std::vector<float> x = {1.0f, -2.5f, 0.0f, std::numeric_limits<float>::infinity()};
    const Bytes b = encode_new(Codec::BF16SR, x, 3, kKey);
    CHECK(b == hex({0x80, 0x3F, 0x20, 0xC0, 0x00, 0x00, 0x80, 0x7F}));
    const Bytes f = encode_new(Codec::F32, x, 3, kKey);
    CHECK(f == hex({0, 0, 0x80, 0x3F, 0, 0, 0x20, 0xC0, 0, 0, 0, 0, 0, 0, 0x80, 0x7F}));
    CHECK(decode_new(Codec::BF16SR, b, 4) == x);
    CHECK(decode_new(Codec::F32, f, 4) == x);
}

TEST_CASE("encode matches the per-element reference of the documented counter mapping",
          "[codec][reference]") {
    // Rounds and indices past 2^32 exercise every counter word; lengths cover short last blocks.
    const std::vector<float> x = assorted_values();
    for (uint64_t first : {uint64_t(0), uint64_t(64 * 12345), (uint64_t(1) << 36) + 64 * 3}) {
        for (RoundingKey key : {kKey, RoundingKey{7, 3, 0}}) {
            for (Codec c : {Codec::Q8, Codec::Q4, Codec::BF16SR, Codec::F32}) {
                INFO(codec_name(c) << " first " << first << " round " << key.round);
                CHECK(encode_new(c, x, first, key) == reference_encode(c, x, first, key));
            }
        }
    }
    // BF16SR ranges may start anywhere.
    const std::vector<float> part(x.begin() + 5, x.begin() + 200);
    CHECK(encode_new(Codec::BF16SR, part, 1000003, kKey) ==
          reference_encode(Codec::BF16SR, part, 1000003, kKey));
}

TEST_CASE("Q8 and Q4 decode within one step of every value", "[codec][roundtrip]") {
    const std::vector<float> x = assorted_values();
    for (Codec c : {Codec::Q8, Codec::Q4}) {
        INFO(codec_name(c));
        const Bytes b = encode_new(c, x, 64, kKey);
        const std::vector<float> y = decode_new(c, b, x.size());
        const double qmax = qmax_of(c);
        for (size_t start = 0; start < x.size(); start += 64) {
            const size_t len = std::min<size_t>(64, x.size() - start);
            double m = 0.0;
            for (size_t i = 0; i < len; i++) {
                m = std::max(m, std::fabs(double(x[start + i])));
            }
            const double s = scale_of(c, b, start / 64);
            INFO("block " << start / 64 << " max " << m << " scale " << s);
            // The scale is max / qmax in fp32 (1 for zeros); below the normal range, rounded up to
            // a multiple of the smallest subnormal.
            if (m == 0.0) {
                CHECK(s == 1.0);
            } else if (m / qmax >= double(FLT_MIN)) {
                CHECK(s == double(float(m) / float(qmax)));
            } else {
                const auto units = uint64_t(std::ldexp(m, 149));  // m = units * 2^-149 exactly
                const uint64_t q = uint64_t(qmax);
                CHECK(s == std::ldexp(double((units + q - 1) / q), -149));
            }
            for (size_t i = start; i < start + len; i++) {
                INFO("element " << i << " x " << x[i] << " decoded " << y[i]);
                const double err = std::fabs(double(x[i]) - double(y[i]));
                // A level times the scale, and at most one step away (less unless clamped).
                const double level = std::round(double(y[i]) / s);
                CHECK(float(level) * float(s) == y[i]);
                CHECK(std::fabs(level) <= qmax);
                CHECK(err <= s);
                if (std::fabs(double(x[i])) < m) {
                    CHECK(err < s);
                }
            }
        }
    }
}

TEST_CASE("BF16SR rounds to a bf16 neighbour, F32 is exact", "[codec][roundtrip]") {
    std::vector<float> x = assorted_values();
    x.push_back(FLT_MIN);
    x.push_back(-3.0e38f);
    const Bytes b = encode_new(Codec::BF16SR, x, 77, kKey);
    const std::vector<float> y = decode_new(Codec::BF16SR, b, x.size());
    for (size_t i = 0; i < x.size(); i++) {
        INFO("element " << i << " x " << x[i] << " decoded " << y[i]);
        const uint32_t hx = std::bit_cast<uint32_t>(x[i]) >> 16;
        const uint32_t hy = std::bit_cast<uint32_t>(y[i]) >> 16;
        CHECK((std::bit_cast<uint32_t>(y[i]) & 0xffffu) == 0);
        CHECK((hy == hx || hy == hx + 1));  // truncated, or one bf16 step away from zero
        CHECK(std::fabs(double(x[i]) - double(y[i])) < bf16_ulp(x[i]));
    }
    const Bytes f = encode_new(Codec::F32, x, 77, kKey);
    CHECK(std::memcmp(f.data(), x.data(), f.size()) == 0);
    CHECK(decode_new(Codec::F32, f, x.size()) == x);
}

TEST_CASE("BF16SR keeps NaN and Inf, only values past the largest bf16 can reach Inf",
          "[codec][roundtrip]") {
    const float inf = std::numeric_limits<float>::infinity();
    // NaNs whose mantissa lives only in the low half, or is all ones (a carry would overflow).
    const std::vector<float> x = {std::bit_cast<float>(0x7f800001u),
                                  std::bit_cast<float>(0xffffffffu),
                                  std::bit_cast<float>(0x7fffffffu),
                                  inf,
                                  -inf,
                                  std::bit_cast<float>(0x7f7f0000u),
                                  FLT_MAX,
                                  -FLT_MAX};
    for (uint64_t round = 0; round < 64; round++) {
        const RoundingKey key{3, round, 0};
        const std::vector<float> y =
            decode_new(Codec::BF16SR, encode_new(Codec::BF16SR, x, 0, key), x.size());
        CHECK(std::isnan(y[0]));
        CHECK(std::isnan(y[1]));
        CHECK(std::signbit(y[1]));
        CHECK(std::isnan(y[2]));
        CHECK(y[3] == inf);
        CHECK(y[4] == -inf);
        CHECK(y[5] == std::bit_cast<float>(0x7f7f0000u));  // the largest bf16 is kept
        CHECK((y[6] == std::bit_cast<float>(0x7f7f0000u) || y[6] == inf));
        CHECK((y[7] == -std::bit_cast<float>(0x7f7f0000u) || y[7] == -inf));
    }
}

TEST_CASE("stochastic rounding is unbiased", "[codec][unbiased]") {
    // 2^24 samples, each off by less than a step with a standard deviation of at most half a step:
    // their mean has a standard deviation of at most 2^-13, about 1.2e-4 of a step, so the 1e-3
    // bound sits eight deviations out, while rounding to nearest would be off by a good fraction
    // of a step. The mean of the error times sign(x) catches a bias towards or away from zero,
    // which would cancel between the signs in the plain mean.
    const size_t blocks = size_t(1) << 18;
    SECTION("Q8 and Q4") {
        for (Codec c : {Codec::Q8, Codec::Q4}) {
            INFO(codec_name(c));
            // Element 0 fixes the scale at 0.5 exactly; the others sit at fractional levels
            // spread over the range, both signs.
            const float s = 0.5f;
            const float qmax = qmax_of(c);
            std::vector<float> block(64);
            block[0] = qmax * s;
            for (size_t i = 1; i < 64; i++) {
                block[i] = s * (qmax * (float(i) / 32.0f - 1.0f) + 0.3f * (i % 2 == 0 ? 1 : -1));
                block[i] = std::clamp(block[i], -qmax * s, qmax * s);
            }
            std::vector<float> x;
            x.reserve(64 * blocks);
            for (size_t b = 0; b < blocks; b++) {
                x.insert(x.end(), block.begin(), block.end());
            }
            const std::vector<float> y = decode_new(c, encode_new(c, x, 0, kKey), x.size());
            double sum = 0.0, outward = 0.0;
            for (size_t i = 0; i < x.size(); i++) {
                sum += double(y[i]) - double(x[i]);
                outward += (double(y[i]) - double(x[i])) * (x[i] < 0.0f ? -1.0 : 1.0);
            }
            CHECK(std::fabs(sum / double(x.size())) < 1e-3 * s);
            CHECK(std::fabs(outward / double(x.size())) < 1e-3 * s);
        }
    }
    SECTION("BF16SR") {
        // Four values at 2^22 element indices each, errors in units of their bf16 step: the bound
        // is four deviations (at most 2^-12) out.
        const std::vector<float> values = {1.0f + 0.3f * 0x1.0p-7f, -0.0123f, 3.7e-20f, 65432.1f};
        std::vector<float> x(64 * blocks);
        for (size_t i = 0; i < x.size(); i++) {
            x[i] = values[i % values.size()];
        }
        const std::vector<float> y =
            decode_new(Codec::BF16SR, encode_new(Codec::BF16SR, x, 0, kKey), x.size());
        std::vector<double> sum(values.size(), 0.0);
        for (size_t i = 0; i < x.size(); i++) {
            sum[i % values.size()] += (double(y[i]) - double(x[i])) / bf16_ulp(x[i]);
        }
        for (size_t v = 0; v < values.size(); v++) {
            INFO("value " << values[v]);
            CHECK(std::fabs(sum[v] / double(x.size() / values.size())) < 1e-3);
        }
    }
}

TEST_CASE("encodes are reproducible and depend on the key", "[codec][reproducible]") {
    auto x = random_vector<float>(64 * 40 + 9, 21, -1.0, 1.0);
    for (Codec c : {Codec::Q8, Codec::Q4, Codec::BF16SR}) {
        INFO(codec_name(c));
        const Bytes a = encode_new(c, x, 640, kKey);
        CHECK(encode_new(c, x, 640, kKey) == a);
        CHECK(encode_new(c, x, 640, RoundingKey{kKey.node_id, kKey.round + 1, kKey.stream}) != a);
        CHECK(encode_new(c, x, 640, RoundingKey{kKey.node_id + 1, kKey.round, kKey.stream}) != a);
        CHECK(encode_new(c, x, 640, RoundingKey{kKey.node_id, kKey.round, kKey.stream + 1}) != a);
        CHECK(encode_new(c, x, 704, kKey) != a);  // the element index feeds the counter
    }
}

TEST_CASE("a range of whole blocks encodes and decodes on its own", "[codec][reproducible]") {
    // Large enough that the whole array is done in parallel and the pieces serially.
    const size_t n = 64 * 2000 + 5;
    auto x = random_vector<float>(n, 22, -3.0, 3.0);
    const uint64_t first = 64 * 1000;
    for (Codec c : {Codec::Q8, Codec::Q4, Codec::BF16SR, Codec::F32}) {
        INFO(codec_name(c));
        const Bytes whole = encode_new(c, x, first, kKey);
        const std::vector<float> decoded = decode_new(c, whole, n);
        // Pieces at block boundaries, the last one ending with the short block.
        const std::vector<std::pair<size_t, size_t>> pieces = {
            {64 * 10, 64 * 37}, {0, 64}, {64 * 1990, n}};
        for (auto [from, to] : pieces) {
            INFO("elements " << from << " to " << to);
            const std::vector<float> part(x.begin() + ptrdiff_t(from), x.begin() + ptrdiff_t(to));
            const size_t lo = encoded_bytes(c, from);
            const size_t hi = lo + encoded_bytes(c, to - from);
            const Bytes piece = encode_new(c, part, first + from, kKey);
            CHECK(piece == slice(whole, lo, hi));
            const std::vector<float> back = decode_new(c, slice(whole, lo, hi), to - from);
            CHECK(back == std::vector<float>(decoded.begin() + ptrdiff_t(from),
                                             decoded.begin() + ptrdiff_t(to)));
        }
    }
    // BF16SR pieces may start and end anywhere.
    const Bytes whole = encode_new(Codec::BF16SR, x, 13, kKey);
    const std::vector<float> part(x.begin() + 101, x.begin() + 70001);
    CHECK(encode_new(Codec::BF16SR, part, 13 + 101, kKey) == slice(whole, 2 * 101, 2 * 70001));
}

TEST_CASE("one thread and two give the same bytes", "[codec][reproducible][threads]") {
    const size_t n = 64 * 3000 + 33;
    auto x = random_vector<float>(n, 23, -1.0, 1.0);
    const int previous = cpu_threads();
    for (Codec c : {Codec::Q8, Codec::Q4, Codec::BF16SR, Codec::F32}) {
        INFO(codec_name(c));
        set_cpu_threads(1);
        const Bytes one = encode_new(c, x, 0, kKey);
        const std::vector<float> one_back = decode_new(c, one, n);
        set_cpu_threads(2);
        const Bytes two = encode_new(c, x, 0, kKey);
        const std::vector<float> two_back = decode_new(c, two, n);
        CHECK(one == two);
        CHECK(one_back == two_back);
    }
    set_cpu_threads(previous);
}

TEST_CASE("error feedback: what was sent plus the residual is what went in", "[codec][feedback]") {
    // Block magnitudes differ by orders of magnitude, like the rows of a real delta; one in eight
    // is subnormal (the tiny-scale path).
    const size_t n = 64 * 50 + 17;
    for (Codec c : {Codec::Q8, Codec::Q4, Codec::BF16SR}) {
        INFO(codec_name(c));
        std::vector<float> residual(n, 0.0f);
        std::vector<double> sent(n, 0.0), total(n, 0.0), magnitude(n, 0.0);
        Bytes wire(encoded_bytes(c, n));
        for (uint64_t round = 0; round < 20; round++) {
            auto delta = random_vector<float>(n, 100 + round, -1.0, 1.0);
            for (size_t i = 0; i < n; i++) {
                const int block_kind = int(i / 64 % 8);
                delta[i] *= std::ldexp(1.0f, block_kind == 7 ? -135 : block_kind * 4 - 20);
            }
            std::vector<float> x(n);
            for (size_t i = 0; i < n; i++) {
                x[i] = delta[i] + residual[i];
            }
            encode_with_feedback(c, delta, residual, 128, RoundingKey{5, round, 2}, wire);
            // The same bytes a plain encode of delta + residual gives.
            CHECK(wire == encode_new(c, x, 128, RoundingKey{5, round, 2}));
            const std::vector<float> y = decode_new(c, wire, n);
            bool exact = true, bounded = true;
            for (size_t i = 0; i < n; i++) {
                exact = exact && residual[i] == x[i] - y[i];
                const double step =
                    c == Codec::BF16SR ? bf16_ulp(x[i]) : double(scale_of(c, wire, i / 64));
                bounded = bounded && std::fabs(double(residual[i])) <= step;

                sent[i] += double(y[i]);
                total[i] += double(delta[i]);
                magnitude[i] += std::fabs(double(delta[i]));
            }
            CHECK(exact);
            CHECK(bounded);
        }
        double worst = 0.0;
        for (size_t i = 0; i < n; i++) {
            worst =
                std::max(worst, std::fabs(sent[i] + double(residual[i]) - total[i]) / magnitude[i]);
        }
        CHECK(worst < 1e-5);
    }
}

TEST_CASE("F32 with feedback sends the sum and leaves a zero residual", "[codec][feedback]") {
    const std::vector<float> delta = {1.5f, -2.0f, 3.25f};
    std::vector<float> residual = {0.5f, 1.0f, -0.25f};
    Bytes wire(12);
    encode_with_feedback(Codec::F32, delta, residual, 0, kKey, wire);
    CHECK(decode_new(Codec::F32, wire, 3) == std::vector<float>{2.0f, -1.0f, 3.0f});
    CHECK(residual == std::vector<float>{0.0f, 0.0f, 0.0f});
}

TEST_CASE("decode rejects hostile input with a message naming the problem", "[codec][hostile]") {
    auto x = random_vector<float>(64 * 3 + 5, 31, -1.0, 1.0);
    std::vector<float> out(x.size());
    auto decode_error = [&](Codec c, const Bytes& b) {
        return error_of([&] { decode(c, b, out); });
    };
    for (Codec c : {Codec::F32, Codec::BF16SR, Codec::Q8, Codec::Q4}) {
        INFO(codec_name(c));
        Bytes b = encode_new(c, x, 0, kKey);
        Bytes shorter(b.begin(), b.end() - 1);
        Bytes longer = b;
        longer.push_back(std::byte(0));
        const std::string expected = std::to_string(b.size());
        CHECK_THAT(
            decode_error(c, shorter),
            Catch::Contains(std::to_string(b.size() - 1) + " bytes") && Catch::Contains(expected));
        CHECK_THAT(decode_error(c, longer),
                   Catch::Contains(std::to_string(b.size() + 1) + " bytes"));
        CHECK(decode_error(c, b) == "(no error)");
    }
    for (Codec c : {Codec::Q8, Codec::Q4}) {
        INFO(codec_name(c));
        const Bytes good = encode_new(c, x, 0, kKey);
        // Block 2's scale: NaN, +Inf, -Inf, negative.
        for (float bad :
             {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
              -std::numeric_limits<float>::infinity(), -1.0f}) {
            Bytes b = good;
            std::memcpy(b.data() + 2 * block_stride(c), &bad, 4);
            CHECK_THAT(decode_error(c, b),
                       Catch::Contains("block 2 of " + std::string(codec_name(c)) +
                                       " data has a NaN/Inf/negative scale"));
        }
        // The short last block (block 3) too.
        Bytes b = good;
        const float nan = std::numeric_limits<float>::quiet_NaN();
        std::memcpy(b.data() + 3 * block_stride(c), &nan, 4);
        CHECK_THAT(decode_error(c, b), Catch::Contains("block 3 of"));
    }
    {
        Bytes b = encode_new(Codec::Q8, x, 0, kKey);
        b[block_stride(Codec::Q8) + 4 + 17] = std::byte(0x80);  // block 1, element 17
        CHECK_THAT(decode_error(Codec::Q8, b), Catch::Contains("block 1 of Q8 data") &&
                                                   Catch::Contains("-128") &&
                                                   Catch::Contains("element 17"));
        b = encode_new(Codec::Q8, x, 0, kKey);
        b[3 * block_stride(Codec::Q8) + 4 + 4] = std::byte(0x80);  // short last block
        CHECK_THAT(decode_error(Codec::Q8, b),
                   Catch::Contains("block 3 of Q8 data") && Catch::Contains("-128"));
    }
    {
        Bytes b = encode_new(Codec::Q4, x, 0, kKey);
        b[4 + 5] =
            (b[4 + 5] & std::byte(0x0F)) | std::byte(0x80);  // block 0, element 11 (high nibble)
        CHECK_THAT(decode_error(Codec::Q4, b), Catch::Contains("block 0 of Q4 data") &&
                                                   Catch::Contains("-8") &&
                                                   Catch::Contains("element 11"));
        b = encode_new(Codec::Q4, x, 0, kKey);
        b[block_stride(Codec::Q4) + 4 + 20] =
            (b[block_stride(Codec::Q4) + 4 + 20] & std::byte(0xF0)) | std::byte(0x08);
        CHECK_THAT(decode_error(Codec::Q4, b),
                   Catch::Contains("block 1 of Q4 data") && Catch::Contains("element 40"));
        b = encode_new(Codec::Q4, x, 0, kKey);
        b.back() |= std::byte(0x10);  // the padding nibble after the fifth value of block 3
        CHECK_THAT(decode_error(Codec::Q4, b),
                   Catch::Contains("block 3 of Q4 data") && Catch::Contains("padding"));
    }
    CHECK_THAT(error_of([] { codec_from_byte(7); }), Catch::Contains("unknown codec byte 7"));
    CHECK_THAT(error_of([] { codec_from_byte(255); }), Catch::Contains("unknown codec byte 255"));
    // A count off the wire whose size overflows.
    CHECK_THAT(error_of([] { encoded_bytes(Codec::F32, std::numeric_limits<size_t>::max() / 2); }),
               Catch::Contains("too many"));
}

TEST_CASE("a large hostile message names its first bad block", "[codec][hostile][threads]") {
    // Parallel decode: two bad blocks, the first one is reported.
    const size_t n = 64 * 4000;
    auto x = random_vector<float>(n, 32, -1.0, 1.0);
    Bytes b = encode_new(Codec::Q8, x, 0, kKey);
    b[3500 * 68 + 4] = std::byte(0x80);
    const float nan = std::numeric_limits<float>::quiet_NaN();
    std::memcpy(b.data() + 1234 * 68, &nan, 4);
    std::vector<float> out(n);
    CHECK_THAT(error_of([&] { decode(Codec::Q8, b, out); }),
               Catch::Contains("block 1234 of Q8 data has a NaN/Inf/negative scale"));
}

TEST_CASE("encode rejects NaN and Inf, wrong sizes and misaligned ranges", "[codec][hostile]") {
    auto x = random_vector<float>(64 * 3, 33, -1.0, 1.0);
    x[64 * 2 + 7] = std::numeric_limits<float>::quiet_NaN();
    for (Codec c : {Codec::Q8, Codec::Q4}) {
        INFO(codec_name(c));
        Bytes out(encoded_bytes(c, x.size()));
        CHECK_THAT(error_of([&] { encode(c, x, 64, kKey, out); }),
                   Catch::Contains("block 2 (elements 192 to 255) holds a NaN or Inf"));
        std::vector<float> y(x.begin(), x.begin() + 64);
        y[3] = -std::numeric_limits<float>::infinity();
        Bytes one(encoded_bytes(c, 64));
        CHECK_THAT(error_of([&] { encode(c, y, 0, kKey, one); }), Catch::Contains("NaN or Inf"));
        CHECK_THAT(error_of([&] { encode(c, std::span<const float>(x).first(64), 32, kKey, one); }),
                   Catch::Contains("first_index 32 is not a multiple"));
    }
    for (Codec c : {Codec::F32, Codec::BF16SR, Codec::Q8, Codec::Q4}) {
        INFO(codec_name(c));
        Bytes out(encoded_bytes(c, x.size()) + 1);
        CHECK_THAT(error_of([&] { encode(c, x, 0, kKey, out); }),
                   Catch::Contains(std::to_string(out.size()) + " bytes"));
        std::vector<float> residual(x.size() - 1);
        CHECK_THAT(error_of([&] { encode_with_feedback(c, x, residual, 0, kKey, out); }),
                   Catch::Contains("residual"));
    }
}
