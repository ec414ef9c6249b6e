// Messages: plans, framing, zstd and the decoder's answer to hostile input. Expectations come from
// the documented layout (README.md, "Messages") and from the element codecs called directly.
#include <xxhash.h>
#include <zstd.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "common/error.h"
#include "model/manifest.h"
#include "codec/codec.h"
#include "codec/message.h"

using namespace starling;
using namespace starling::codec;

namespace {

using Bytes = std::vector<std::byte>;
using Parts = std::vector<Bytes>;

ModelConfig make_config(int n_layer, int d_model, int n_head, int d_ff, int vocab) {
    ModelConfig c;
    c.n_layer = n_layer;
    c.d_model = d_model;
    c.n_head = n_head;
    c.d_ff = d_ff;
    c.vocab_size = vocab;
    return c;
}

// nano: 4 layers, d_model 128, 885,888 parameters, every tensor offset a multiple of 64.
const ParameterManifest& nano() {
    static const ParameterManifest m(make_config(4, 128, 4, 384, 256));
    return m;
}

std::vector<float> normal_arena(size_t n, uint32_t seed, float std = 0.02f) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> dist(0.0f, std);
    std::vector<float> x(n);
    for (float& v : x) v = dist(rng);
    return x;
}

// Random finite bit patterns: nothing for zstd to find.
std::vector<float> random_bits_arena(size_t n, uint32_t seed) {
    std::mt19937 rng(seed);
    std::vector<float> x(n);
    for (float& v : x) {
        uint32_t bits = rng();
        if (((bits >> 23) & 0xff) == 0xff) bits &= ~(1u << 30);
        std::memcpy(&v, &bits, 4);
    }
    return x;
}

uint64_t le(const Bytes& b, size_t offset, int n) {
    uint64_t v = 0;
    for (int i = 0; i < n; i++) v |= static_cast<uint64_t>(b.at(offset + i)) << (8 * i);
    return v;
}
void set_le(Bytes& b, size_t offset, int n, uint64_t v) {
    for (int i = 0; i < n; i++) b.at(offset + i) = static_cast<std::byte>(v >> (8 * i));
}

// Checksums recomputed from the documented formulas, so tampered fields reach deeper checks.
void reseal_header(Bytes& h) { set_le(h, 56, 8, XXH3_64bits(h.data(), 56)); }
void reseal_chunk(Bytes& c, const Bytes& header) {
    const uint64_t seed = le(header, 56, 8);
    const uint64_t h = XXH3_64bits_withSeed(c.data(), 40, seed);
    set_le(c, 40, 8, XXH3_64bits_withSeed(c.data() + 48, c.size() - 48, h));
}
void reseal_all(Parts& parts) {
    reseal_header(parts[0]);
    for (size_t i = 1; i < parts.size(); i++) reseal_chunk(parts[i], parts[0]);
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// What the message must deliver: each segment through the element codec directly, with the RNG
// index of its first element given by the caller.
std::vector<float> direct_round_trip(const std::vector<Segment>& plan, const std::vector<float>& x,
                                     const RoundingKey& key, std::vector<float>* residual) {
    std::vector<float> out(x.size());
    for (const Segment& s : plan) {
        Bytes buf(encoded_bytes(s.codec, s.numel));
        const std::span<const float> src(x.data() + s.offset, s.numel);
        if (residual) {
            encode_with_feedback(s.codec, src,
                                 std::span<float>(residual->data() + s.offset, s.numel), s.offset,
                                 key, buf);
        } else {
            encode(s.codec, src, s.offset, key, buf);
        }
        decode(s.codec, buf, std::span<float>(out.data() + s.offset, s.numel));
    }
    return out;
}

size_t total_bytes(const Parts& parts) {
    size_t n = 0;
    for (const Bytes& p : parts) n += p.size();
    return n;
}

struct Fixture {
    const ParameterManifest& m = nano();
    std::vector<float> dest = std::vector<float>(nano().total());
    MessageDecoder decoder{nano().fingerprint(), nano(), dest.data(), dest.size()};
};

// Feeds the header and then chunks until one throws; checks the error names the problem and that
// the decoder then refuses everything, even a valid header or chunk.
void expect_failure(const Parts& parts, const std::string& word) {
    Fixture f;
    bool threw = false;
    for (size_t i = 0; i < parts.size() && !threw; i++) {
        try {
            if (i == 0)
                f.decoder.accept_header(parts[i]);
            else
                f.decoder.accept_chunk(parts[i]);
        } catch (const Error& e) {
            threw = true;
            INFO("error: " << e.what());
            CHECK_THAT(e.what(), Catch::Matchers::Contains(word, Catch::CaseSensitive::No));
        }
    }
    REQUIRE(threw);
    CHECK(f.decoder.failed());
    CHECK_THROWS_WITH(f.decoder.accept_header(parts[0]), Catch::Matchers::Contains("refusing"));
    CHECK_THROWS_WITH(f.decoder.accept_chunk(parts.size() > 1 ? parts[1] : parts[0]),
                      Catch::Matchers::Contains("refusing"));
}

const RoundingKey kKey{0x1234'5678'9abc'def0ULL, 42, 7};

}  // namespace

// ---------------------------------------------------------------------------------------------
// Plans

TEST_CASE("state plan: 1-D and small tensors as F32, adjacent tensors merged, by hand") {
    // n_layer 1, d_model 64, d_ff 128, vocab 128: embed 8192, norms 64, q/k/v/o 4096 (not under
    // 4096, so coded), gate/up/down 8192 each.
    const ParameterManifest m(make_config(1, 64, 4, 128, 128));
    const std::vector<Segment> expected{
        {0, 8192, Codec::BF16SR, 0},          {8192, 64, Codec::F32, 8192},
        {8256, 16384, Codec::BF16SR, 8256},   {24640, 64, Codec::F32, 24640},
        {24704, 24576, Codec::BF16SR, 24704}, {49280, 64, Codec::F32, 49280},
    };
    CHECK(state_plan(m, Codec::BF16SR) == expected);
    CHECK(state_plan(m, Codec::F32) == std::vector<Segment>{{0, 49344, Codec::F32, 0}});
    CHECK(delta_plan(m, Codec::Q4) == std::vector<Segment>{{0, 49344, Codec::Q4, 0}});
}

TEST_CASE("state plan: RNG indices stay block-aligned after a segment of partial blocks") {
    // d_model 40: embed 5120 (Q8); norms 40 and q/k/v/o 1600 (< 4096) merge into 6480 F32;
    // gate/up/down 5120 each merge into 15360 Q8 at offset 11600; the final norm 40 F32.
    const ParameterManifest m(make_config(1, 40, 2, 128, 128));
    const std::vector<Segment> expected{
        {0, 5120, Codec::Q8, 0},
        {5120, 6480, Codec::F32, 5120},
        {11600, 15360, Codec::Q8, 5120 + 6528},  // 6480 rounded up to whole blocks
        {26960, 40, Codec::F32, 11648 + 15360},
    };
    CHECK(state_plan(m, Codec::Q8) == expected);
}

TEST_CASE("plans refuse a codec of the other kind") {
    CHECK_THROWS_WITH(delta_plan(nano(), Codec::BF16SR), Catch::Matchers::Contains("not valid"));
    CHECK_THROWS_WITH(state_plan(nano(), Codec::Q4), Catch::Matchers::Contains("not valid"));
    CHECK(fingerprint_hex(fingerprint_value(nano().fingerprint())) == nano().fingerprint());
    CHECK_THROWS_AS(fingerprint_value("12345"), Error);
    CHECK_THROWS_AS(fingerprint_value("zz23456789abcdef"), Error);
}

// ---------------------------------------------------------------------------------------------
// Round trips

TEST_CASE("delta messages decode bit for bit like the element codec, with and without zstd") {
    const ParameterManifest& m = nano();
    const std::vector<float> x = normal_arena(m.total(), 1, 1e-3f);
    for (Codec codec : {Codec::Q8, Codec::Q4, Codec::F32}) {
        for (bool zstd : {false, true}) {
            for (bool feedback : {false, true}) {
                INFO(codec_name(codec) << " zstd " << zstd << " feedback " << feedback);
                const MessagePlan plan = make_plan(m, PlanKind::Delta, codec);
                REQUIRE(plan.segments.size() == 1);
                std::vector<float> residual = normal_arena(m.total(), 2, 1e-4f);
                std::vector<float> residual_direct = residual;
                const std::vector<float> expected = direct_round_trip(
                    plan.segments, x, kKey, feedback ? &residual_direct : nullptr);

                const Parts parts = encode_message(plan, kKey, x.data(),
                                                   feedback ? residual.data() : nullptr, zstd);
                std::vector<float> got(m.total(), -1.0f);
                decode_message(parts, m.fingerprint(), m, got.data(), got.size());
                CHECK(same_bits(got, expected));
                if (feedback) CHECK(same_bits(residual, residual_direct));
                if (codec == Codec::F32 && !feedback) CHECK(same_bits(got, x));
            }
        }
    }
}

TEST_CASE("state messages decode like the codec per segment, 1-D and small tensors exactly") {
    const ParameterManifest& m = nano();
    std::vector<float> x = normal_arena(m.total(), 3);
    for (const TensorInfo& t : m.tensors()) {
        if (t.shape.size() == 1) {
            for (size_t i = 0; i < t.numel; i++)
                x[t.offset + i] = 1.0f + 1e-4f * static_cast<float>(i);
        }
    }
    for (Codec codec : {Codec::BF16SR, Codec::Q8, Codec::F32}) {
        for (bool zstd : {false, true}) {
            INFO(codec_name(codec) << " zstd " << zstd);
            const MessagePlan plan = make_plan(m, PlanKind::State, codec);
            // nano's offsets are all whole blocks, so the RNG index of a segment is its offset.
            for (const Segment& s : plan.segments) CHECK(s.first_index == s.offset);
            const std::vector<float> expected = direct_round_trip(plan.segments, x, kKey, nullptr);
            const Parts parts = encode_message(plan, kKey, x.data(), nullptr, zstd);
            std::vector<float> got(m.total(), -1.0f);
            decode_message(parts, m.fingerprint(), m, got.data(), got.size());
            CHECK(same_bits(got, expected));

            size_t coded_tensors = 0;
            for (const TensorInfo& t : m.tensors()) {
                const bool exact_expected = t.shape.size() == 1 || t.numel < 4096;
                const bool exact = std::memcmp(got.data() + t.offset, x.data() + t.offset,
                                               t.numel * sizeof(float)) == 0;
                INFO(t.name);
                if (exact_expected || codec == Codec::F32) {
                    CHECK(exact);
                } else {
                    CHECK_FALSE(exact);  // really went through the lossy codec
                    coded_tensors++;
                }
            }
            if (codec != Codec::F32)
                CHECK(coded_tensors == m.tensors().size() - 9);  // 9 norm gains
        }
    }
}

TEST_CASE(
    "the encoder streams the same chunks encode_message returns, and the decoder "
    "completes only at the last chunk") {
    const ParameterManifest& m = nano();
    const std::vector<float> x = normal_arena(m.total(), 4);
    const MessagePlan plan = make_plan(m, PlanKind::State, Codec::BF16SR);
    const Parts parts = encode_message(plan, kKey, x.data(), nullptr, true);
    MessageEncoder encoder(plan, kKey, x.data(), nullptr, true);
    CHECK(encoder.header_bytes() == parts[0]);
    CHECK(encoder.chunk_count() + 1 == parts.size());
    Bytes chunk;
    size_t i = 1;
    while (encoder.next_chunk(chunk)) CHECK(chunk == parts.at(i++));
    CHECK(i == parts.size());

    std::vector<float> got(m.total());
    MessageDecoder decoder(m.fingerprint(), m, got.data(), got.size());
    decoder.accept_header(parts[0]);
    CHECK(decoder.header().round == 42);
    CHECK(decoder.header().node_id == kKey.node_id);
    CHECK(decoder.header().stream == 7);
    CHECK(decoder.header().kind == PlanKind::State);
    CHECK(decoder.header().codec == Codec::BF16SR);
    for (size_t k = 1; k < parts.size(); k++) {
        CHECK_FALSE(decoder.complete());
        decoder.accept_chunk(parts[k]);
    }
    CHECK(decoder.complete());
}

// ---------------------------------------------------------------------------------------------
// Chunking and zstd

TEST_CASE("a message above 4 MiB splits into chunks of whole blocks, none above the cap") {
    // 4 layers at d_model 256: 3,474,688 parameters, 13.9 MB as F32.
    const ParameterManifest m(make_config(4, 256, 4, 768, 256));
    const std::vector<float> x = normal_arena(m.total(), 5);
    const std::pair<PlanKind, Codec> cases[] = {{PlanKind::Delta, Codec::F32},
                                                {PlanKind::State, Codec::F32},
                                                {PlanKind::State, Codec::BF16SR}};
    for (const auto& [kind, codec] : cases) {
        INFO(plan_kind_name(kind) << " " << codec_name(codec));
        const MessagePlan plan = make_plan(m, kind, codec);
        const Parts parts = encode_message(plan, kKey, x.data(), nullptr, false);
        if (codec == Codec::F32) {
            // One segment; 4 MiB holds 1,048,576 floats.
            CHECK(plan.segments.size() == 1);
            CHECK(parts.size() - 1 == 4);
        } else {
            // The largest segment (gate, up, down: 589,824 values, 1.2 MB) fits one chunk.
            CHECK(parts.size() - 1 == plan.segments.size());
        }
        uint64_t covered = 0;
        for (size_t i = 1; i < parts.size(); i++) {
            const Bytes& c = parts[i];
            CHECK(le(c, 0, 4) == i - 1);             // chunk index
            CHECK(le(c, 28, 4) <= size_t{4} << 20);  // uncompressed length
            CHECK(le(c, 24, 4) == c.size() - 48);    // payload length
            CHECK(le(c, 8, 8) % 64 == 0);            // first element: a whole block
            const Segment& s = plan.segments.at(le(c, 4, 4));
            CHECK(le(c, 8, 8) + le(c, 16, 8) <= s.numel);
            covered += le(c, 16, 8);
        }
        CHECK(covered == m.total());
        CHECK(le(parts[0], 48, 4) == parts.size() - 1);  // header chunk count
        std::vector<float> got(m.total());
        decode_message(parts, m.fingerprint(), m, got.data(), got.size());
        if (codec == Codec::F32) CHECK(same_bits(got, x));
    }
}

TEST_CASE("zstd pays on a compressible arena and is skipped on random data") {
    const ParameterManifest& m = nano();
    SECTION("mostly zeros") {
        std::vector<float> x(m.total(), 0.0f);
        for (size_t i = 0; i < x.size(); i += 97) x[i] = 0.01f * static_cast<float>(i % 13);
        for (Codec codec : {Codec::Q8, Codec::F32}) {
            const MessagePlan plan = make_plan(m, PlanKind::Delta, codec);
            const Parts raw = encode_message(plan, kKey, x.data(), nullptr, false);
            const Parts packed = encode_message(plan, kKey, x.data(), nullptr, true);
            CHECK(static_cast<uint8_t>(packed[0][10]) == 1);  // header: zstd tried
            CHECK(static_cast<uint8_t>(raw[0][10]) == 0);
            for (size_t i = 1; i < packed.size(); i++) {
                CHECK(static_cast<uint8_t>(packed[i][32]) == 1);  // chunk: compressed
                CHECK(static_cast<uint8_t>(raw[i][32]) == 0);
            }
            CHECK(total_bytes(packed) * 4 < total_bytes(raw));
            std::vector<float> a(m.total()), b(m.total());
            decode_message(raw, m.fingerprint(), m, a.data(), a.size());
            decode_message(packed, m.fingerprint(), m, b.data(), b.size());
            CHECK(same_bits(a, b));
        }
    }
    SECTION("random bits") {
        const std::vector<float> x = random_bits_arena(m.total(), 6);
        const MessagePlan plan = make_plan(m, PlanKind::Delta, Codec::F32);
        const Parts packed = encode_message(plan, kKey, x.data(), nullptr, true);
        for (size_t i = 1; i < packed.size(); i++) CHECK(static_cast<uint8_t>(packed[i][32]) == 0);
        CHECK(total_bytes(packed) == 64 + 48 * (packed.size() - 1) + 4 * m.total());
        std::vector<float> got(m.total());
        decode_message(packed, m.fingerprint(), m, got.data(), got.size());
        CHECK(same_bits(got, x));
    }
}

// ---------------------------------------------------------------------------------------------
// Layout

TEST_CASE("header and chunk bytes follow the documented layout") {
    const ParameterManifest& m = nano();
    const std::vector<float> x = normal_arena(m.total(), 7);
    const MessagePlan plan = make_plan(m, PlanKind::Delta, Codec::Q8);
    const Parts parts = encode_message(plan, {0x0102030405060708ULL, 0x1122334455667788ULL, 9},
                                       x.data(), nullptr, false);
    const Bytes& h = parts[0];
    REQUIRE(h.size() == 64);
    CHECK(static_cast<char>(h[0]) == 'S');
    CHECK(static_cast<char>(h[1]) == 'M');
    CHECK(static_cast<char>(h[2]) == 'S');
    CHECK(static_cast<char>(h[3]) == 'G');
    CHECK(le(h, 4, 2) == 1);        // version
    CHECK(le(h, 6, 1) == 0);        // plan kind: delta
    CHECK(le(h, 7, 1) == 2);        // codec: Q8
    CHECK(le(h, 8, 2) == 64);       // block size
    CHECK(le(h, 10, 1) == 0);       // flags: no zstd
    CHECK(le(h, 12, 4) == 9);       // stream
    CHECK(le(h, 16, 8) == 885888);  // element count
    CHECK(le(h, 24, 8) == std::stoull(m.fingerprint(), nullptr, 16));
    CHECK(static_cast<uint8_t>(h[32]) == 0x88);  // round, little-endian
    CHECK(le(h, 32, 8) == 0x1122334455667788ULL);
    CHECK(le(h, 40, 8) == 0x0102030405060708ULL);  // sender node id
    CHECK(le(h, 48, 4) == 1);                      // one chunk: 885,888 Q8 values are 941,256 bytes
    CHECK(le(h, 52, 4) == 0);
    CHECK(le(h, 56, 8) == XXH3_64bits(h.data(), 56));

    REQUIRE(parts.size() == 2);
    const Bytes& c = parts[1];
    CHECK(le(c, 0, 4) == 0);                  // chunk index
    CHECK(le(c, 4, 4) == 0);                  // segment
    CHECK(le(c, 8, 8) == 0);                  // first element
    CHECK(le(c, 16, 8) == 885888);            // element count
    CHECK(le(c, 24, 4) == 885888 / 64 * 68);  // payload length: 64 int8 + an fp32 scale per block
    CHECK(le(c, 28, 4) == le(c, 24, 4));
    CHECK(le(c, 32, 8) == 0);  // flags and reserved
    CHECK(c.size() == 48 + le(c, 24, 4));
    const uint64_t seed = XXH3_64bits_withSeed(c.data(), 40, le(h, 56, 8));
    CHECK(le(c, 40, 8) == XXH3_64bits_withSeed(c.data() + 48, c.size() - 48, seed));
}

// ---------------------------------------------------------------------------------------------
// Hostile input

namespace {

// A state message on nano: one chunk per segment, 18 chunks, none compressed.
Parts state_message(bool zstd = false, uint64_t round = 42) {
    static const std::vector<float> x = normal_arena(nano().total(), 8);
    RoundingKey key = kKey;
    key.round = round;
    return encode_message(make_plan(nano(), PlanKind::State, Codec::BF16SR), key, x.data(), nullptr,
                          zstd);
}

// A delta message with zstd on every chunk (a sparse arena compresses).
Parts compressed_message() {
    std::vector<float> x(nano().total(), 0.0f);
    for (size_t i = 0; i < x.size(); i += 61) x[i] = 1e-3f;
    return encode_message(make_plan(nano(), PlanKind::Delta, Codec::Q8), kKey, x.data(), nullptr,
                          true);
}

}  // namespace

TEST_CASE("hostile headers: each problem is named and the decoder refuses input afterwards") {
    const Parts good = state_message();
    REQUIRE(good.size() > 3);
    // Modify the header, reseal it and every chunk so only the intended check can fire.
    auto tampered = [&](const std::function<void(Bytes&)>& change, bool reseal = true) {
        Parts p = good;
        change(p[0]);
        if (reseal) reseal_all(p);
        return p;
    };
    SECTION("truncated") {
        expect_failure(tampered([](Bytes& h) { h.resize(63); }, false), "truncated");
    }
    SECTION("trailing bytes") {
        expect_failure(tampered([](Bytes& h) { h.push_back(std::byte{0}); }, false), "trailing");
    }
    SECTION("bad magic") {
        expect_failure(tampered([](Bytes& h) { h[0] = std::byte{'X'}; }), "magic");
    }
    SECTION("unsupported version") {
        expect_failure(tampered([](Bytes& h) { set_le(h, 4, 2, 2); }), "version");
    }
    SECTION("checksum mismatch") {
        expect_failure(tampered([](Bytes& h) { set_le(h, 32, 8, 43); }, false), "checksum");
    }
    SECTION("unknown codec") {
        expect_failure(tampered([](Bytes& h) { h[7] = std::byte{9}; }), "codec");
    }
    SECTION("unknown plan kind") {
        expect_failure(tampered([](Bytes& h) { h[6] = std::byte{3}; }), "plan kind");
    }
    SECTION("codec of the wrong kind") {
        expect_failure(tampered([](Bytes& h) { h[6] = std::byte{0}; }), "not valid for a delta");
    }
    SECTION("block size") {
        expect_failure(tampered([](Bytes& h) { set_le(h, 8, 2, 32); }), "block size");
    }
    SECTION("element count") {
        expect_failure(tampered([](Bytes& h) { set_le(h, 16, 8, 885887); }), "element count");
    }
    SECTION("wrong fingerprint names both models") {
        expect_failure(
            tampered([](Bytes& h) { set_le(h, 24, 8, 0x00000000deadbeefULL); }),
            "message for model 00000000deadbeef, this node runs " + nano().fingerprint());
    }
    SECTION("impossible chunk count") {
        expect_failure(tampered([](Bytes& h) { set_le(h, 48, 4, 0); }), "chunk count");
    }
    SECTION("reserved bytes") {
        expect_failure(tampered([](Bytes& h) { h[11] = std::byte{1}; }), "reserved");
    }
    SECTION("a second header") {
        Fixture f;
        f.decoder.accept_header(good[0]);
        CHECK_THROWS_WITH(f.decoder.accept_header(good[0]),
                          Catch::Matchers::Contains("second header"));
        CHECK_THROWS_WITH(f.decoder.accept_chunk(good[1]), Catch::Matchers::Contains("refusing"));
    }
}

TEST_CASE("hostile chunks: each problem is named and the decoder refuses input afterwards") {
    const Parts good = state_message();
    REQUIRE(good.size() > 3);
    // Modify chunk i and (optionally) reseal it.
    auto tampered = [&](size_t i, const std::function<void(Bytes&)>& change, bool reseal = true) {
        Parts p = good;
        change(p[i]);
        if (reseal) reseal_chunk(p[i], p[0]);
        return p;
    };
    SECTION("truncated chunk header") {
        expect_failure(tampered(
                           1, [](Bytes& c) { c.resize(40); }, false),
                       "truncated");
    }
    SECTION("truncated payload") {
        expect_failure(tampered(2, [](Bytes& c) { c.pop_back(); }), "truncated");
    }
    SECTION("trailing bytes") {
        expect_failure(tampered(2, [](Bytes& c) { c.push_back(std::byte{0}); }), "trailing");
    }
    SECTION("out of order") {
        Parts p = good;
        std::swap(p[1], p[2]);
        expect_failure(p, "out of order");
    }
    SECTION("duplicate") {
        Parts p = good;
        p.insert(p.begin() + 2, p[1]);
        expect_failure(p, "out of order");
    }
    SECTION("index right but the range skips ahead") {
        // Chunk 0 claiming elements [64, end) of segment 0: whole blocks inside the plan, but not
        // the next elements.
        expect_failure(tampered(1,
                                [](Bytes& c) {
                                    set_le(c, 8, 8, 64);
                                    set_le(c, 16, 8, le(c, 16, 8) - 64);
                                }),
                       "out of order");
    }
    SECTION("segment index outside the plan") {
        expect_failure(tampered(1, [](Bytes& c) { set_le(c, 4, 4, 999); }), "outside the plan");
    }
    SECTION("element range outside the segment") {
        expect_failure(tampered(1, [](Bytes& c) { set_le(c, 16, 8, ~uint64_t{0} - 10); }),
                       "outside segment");
        expect_failure(tampered(1, [](Bytes& c) { set_le(c, 8, 8, ~uint64_t{0} - 63); }),
                       "outside segment");
    }
    SECTION("range not aligned to blocks") {
        expect_failure(tampered(1, [](Bytes& c) { set_le(c, 16, 8, 100); }), "aligned");
        expect_failure(tampered(1,
                                [](Bytes& c) {
                                    set_le(c, 8, 8, 1);
                                    set_le(c, 16, 8, 64);
                                }),
                       "aligned");
    }
    SECTION("payload length does not match the element count") {
        expect_failure(tampered(1, [](Bytes& c) { set_le(c, 16, 8, 64); }), "does not match");
        expect_failure(tampered(1, [](Bytes& c) { set_le(c, 28, 4, le(c, 28, 4) + 2); }),
                       "does not match");
        expect_failure(tampered(1, [](Bytes& c) { set_le(c, 24, 4, le(c, 24, 4) - 2); }),
                       "payload length");
    }
    SECTION("uncompressed length above the cap") {
        expect_failure(tampered(1, [](Bytes& c) { set_le(c, 28, 4, 5u << 20); }), "above the cap");
    }
    SECTION("chunk checksum mismatch") {
        expect_failure(tampered(
                           3, [](Bytes& c) { c[100] ^= std::byte{1}; }, false),
                       "checksum");
    }
    SECTION("a chunk from another message fails its checksum") {
        const Parts other = state_message(false, 43);
        Parts p = good;
        p[2] = other[2];
        expect_failure(p, "checksum");
    }
    SECTION("reserved chunk bytes") {
        expect_failure(tampered(1, [](Bytes& c) { c[35] = std::byte{1}; }), "reserved");
    }
    SECTION("compressed chunk in a message whose header says no zstd") {
        expect_failure(tampered(1, [](Bytes& c) { c[32] = std::byte{1}; }), "header");
    }
    SECTION("chunk after completion") {
        Parts p = good;
        p.push_back(p[1]);
        expect_failure(p, "after completion");
    }
    SECTION("chunk before the header") {
        Fixture f;
        CHECK_THROWS_WITH(f.decoder.accept_chunk(good[1]),
                          Catch::Matchers::Contains("before the header"));
        CHECK_THROWS_WITH(f.decoder.accept_header(good[0]), Catch::Matchers::Contains("refusing"));
    }
    SECTION("header announces more chunks than the message has") {
        Parts p = good;
        set_le(p[0], 48, 4, le(p[0], 48, 4) + 1);
        reseal_all(p);
        expect_failure(p, "chunk count");
    }
    SECTION("message ends early") {
        Parts p = good;
        p.pop_back();
        std::vector<float> dest(nano().total());
        CHECK_THROWS_WITH(decode_message(p, nano().fingerprint(), nano(), dest.data(), dest.size()),
                          Catch::Matchers::Contains("incomplete"));
    }
}

TEST_CASE("hostile zstd payloads and scales") {
    SECTION("zstd failure on a payload that is not zstd") {
        // Random bits do not compress: the chunk stays raw in a message that tried zstd.
        Parts p = encode_message(make_plan(nano(), PlanKind::Delta, Codec::F32), kKey,
                                 random_bits_arena(nano().total(), 10).data(), nullptr, true);
        REQUIRE(static_cast<uint8_t>(p[0][10]) == 1);
        REQUIRE(static_cast<uint8_t>(p[1][32]) == 0);
        p[1][32] = std::byte{1};
        reseal_chunk(p[1], p[0]);
        expect_failure(p, "zstd failure");
    }
    SECTION("decompressed size mismatch") {
        Parts p = compressed_message();
        REQUIRE(static_cast<uint8_t>(p[1][32]) == 1);
        const Bytes short_payload(1000, std::byte{0});
        Bytes z(ZSTD_compressBound(short_payload.size()));
        z.resize(ZSTD_compress(z.data(), z.size(), short_payload.data(), short_payload.size(), 1));
        p[1].resize(48);
        p[1].insert(p[1].end(), z.begin(), z.end());
        set_le(p[1], 24, 4, z.size());
        reseal_chunk(p[1], p[0]);
        expect_failure(p, "size mismatch");
    }
    SECTION("decompressing to more than the chunk holds") {
        Parts p = compressed_message();
        const Bytes long_payload(le(p[1], 28, 4) + 64, std::byte{0});
        Bytes z(ZSTD_compressBound(long_payload.size()));
        z.resize(ZSTD_compress(z.data(), z.size(), long_payload.data(), long_payload.size(), 1));
        p[1].resize(48);
        p[1].insert(p[1].end(), z.begin(), z.end());
        set_le(p[1], 24, 4, z.size());
        reseal_chunk(p[1], p[0]);
        expect_failure(p, "zstd");
    }
    SECTION("corrupted compressed bytes behind a valid checksum") {
        Parts p = compressed_message();
        for (size_t i = 60; i < p[1].size(); i += 7) p[1][i] ^= std::byte{0x5a};
        reseal_chunk(p[1], p[0]);
        expect_failure(p, "zstd");
    }
    SECTION("NaN and Inf scales") {
        for (uint8_t fill : {uint8_t{0xff}, uint8_t{0x7f}}) {
            // All 0xff: every fp32 scale is a NaN. 0x7f7f7f7f is finite; patch to Inf below.
            Parts p = encode_message(make_plan(nano(), PlanKind::Delta, Codec::Q8), kKey,
                                     normal_arena(nano().total(), 9).data(), nullptr, false);
            std::fill(p[1].begin() + 48, p[1].end(), std::byte{fill});
            if (fill == 0x7f) {
                // Make every aligned 4-byte word +Inf: wherever the scales sit, they are Inf.
                for (size_t i = 48; i + 4 <= p[1].size(); i += 4) set_le(p[1], i, 4, 0x7f800000u);
            }
            reseal_chunk(p[1], p[0]);
            expect_failure(p, fill == 0xff ? "nan" : "inf");
        }
    }
}

TEST_CASE("encoder and decoder refuse inconsistent arguments") {
    const ParameterManifest& m = nano();
    std::vector<float> x(m.total(), 0.0f), residual(m.total(), 0.0f);
    CHECK_THROWS_WITH(MessageEncoder(make_plan(m, PlanKind::State, Codec::Q8), kKey, x.data(),
                                     residual.data(), false),
                      Catch::Matchers::Contains("delta messages only"));
    MessagePlan gappy = make_plan(m, PlanKind::State, Codec::Q8);
    gappy.segments.erase(gappy.segments.begin() + 1);
    CHECK_THROWS_WITH(MessageEncoder(gappy, kKey, x.data(), nullptr, false),
                      Catch::Matchers::Contains("tile"));
    CHECK_THROWS_WITH(MessageDecoder(m.fingerprint(), m, x.data(), 2 * x.size() + 1),
                      Catch::Matchers::Contains("arena"));
    CHECK_THROWS_WITH(MessageDecoder(m.fingerprint(), m, x.data(), 0),
                      Catch::Matchers::Contains("arena"));
    CHECK_THROWS_WITH(MessageDecoder("0123456789abcdef", m, x.data(), x.size()),
                      Catch::Matchers::Contains("fingerprint"));
}

TEST_CASE("sample messages carry F32 values exactly into an arena of the sample's count") {
    const ParameterManifest& m = nano();
    const std::vector<float> x = normal_arena(1000, 5);
    const Parts parts =
        encode_message(sample_plan(m, x.size()), kKey, x.data(), nullptr, /*try_zstd=*/true);
    CHECK(static_cast<uint8_t>(parts[0][6]) == 2);  // plan kind
    CHECK(le(parts[0], 16, 8) == 1000);             // element count
    std::vector<float> out(x.size());
    decode_message(parts, m.fingerprint(), m, out.data(), out.size());
    CHECK(out == x);
    CHECK(payload_bytes(sample_plan(m, x.size())) == 4000);
    // An arena of another count, a sample above the manifest's total and a state or delta header
    // claiming a sample's count are each refused by name.
    std::vector<float> other(999);
    CHECK_THROWS_WITH(decode_message(parts, m.fingerprint(), m, other.data(), other.size()),
                      Catch::Matchers::Contains("element count 1000 does not match the arena"));
    CHECK_THROWS_WITH(sample_plan(m, 2 * m.total() + 1), Catch::Matchers::Contains("at most 2"));
    CHECK_THROWS_WITH(sample_plan(m, 0), Catch::Matchers::Contains("at least 1"));
    CHECK_THROWS_WITH(make_plan(m, PlanKind::Sample, Codec::F32),
                      Catch::Matchers::Contains("sample_plan"));
    Parts as_state = parts;
    as_state[0][6] = std::byte{1};
    reseal_all(as_state);
    CHECK_THROWS_WITH(decode_message(as_state, m.fingerprint(), m, out.data(), out.size()),
                      Catch::Matchers::Contains("a state message of 1000 elements"));
}

TEST_CASE("rounding_bounds hold every decoded value within reach of the one encoded") {
    // State messages of nano under each state codec: at every index the decoded value lies within
    // its bound of the encoded one, and the bounds are not slack (the largest error comes within
    // half of its bound: one rounding step is what each codec can take).
    const ParameterManifest& m = nano();
    const std::vector<float> x = normal_arena(m.total(), 11, 0.05f);
    std::vector<uint64_t> every(m.total());
    for (uint64_t i = 0; i < every.size(); i++) every[i] = i;
    for (const Codec codec : {Codec::F32, Codec::BF16SR, Codec::Q8}) {
        INFO(codec_name(codec));
        const MessagePlan plan = make_plan(m, PlanKind::State, codec);
        std::vector<float> decoded(m.total());
        decode_message(encode_message(plan, kKey, x.data(), nullptr, false), m.fingerprint(), m,
                       decoded.data(), decoded.size());
        const std::vector<float> bounds = rounding_bounds(plan, decoded, every);
        REQUIRE(bounds.size() == every.size());
        double worst = 0.0;  // the largest error over its bound, where the bound is not 0
        size_t outside = 0;
        for (size_t i = 0; i < x.size(); i++) {
            const float error = std::abs(decoded[i] - x[i]);
            outside += !(error <= bounds[i]);
            if (bounds[i] > 0.0f) worst = std::max(worst, double(error) / bounds[i]);
        }
        CHECK(outside == 0);
        if (codec != Codec::F32) CHECK(worst > 0.5);
        // F32 segments (1-D and small tensors) allow no difference at all.
        CHECK(bounds[m.find("model.norm.weight").offset] == 0.0f);
    }
    CHECK_THROWS_WITH(rounding_bounds(make_plan(m, PlanKind::State, Codec::Q8), x,
                                      std::vector<uint64_t>{m.total()}),
                      Catch::Matchers::Contains("past the arena"));
}

// ---------------------------------------------------------------------------------------------
// TOPK

namespace {

// The sparse codec called directly over the whole arena (a delta plan's one segment).
std::vector<float> direct_sparse(const SparseFormat& f, const std::vector<float>& x, float decay,
                                 const RoundingKey& key, std::vector<float>* residual) {
    Bytes buf(sparse_encoded_bytes(f, x.size()));
    if (residual) {
        sparse_encode_with_feedback(f, decay, x, *residual, 0, key, buf);
    } else {
        sparse_encode(f, x, 0, key, buf);
    }
    std::vector<float> out(x.size());
    sparse_decode(f, buf, out);
    return out;
}

const SparseFormat kSmallTopk{256, 8, 4};

Parts topk_message(const SparseFormat& f = kSmallTopk) {
    static const std::vector<float> x = normal_arena(nano().total(), 9, 1e-3f);
    return encode_message(make_plan(nano(), PlanKind::Delta, Codec::TOPK, f), kKey, x.data(),
                          nullptr, false);
}

}  // namespace

TEST_CASE("TOPK delta messages decode like the sparse codec, the format in the header") {
    const ParameterManifest& m = nano();
    const std::vector<float> x = normal_arena(m.total(), 3, 1e-3f);
    for (const SparseFormat& f : {SparseFormat{}, kSmallTopk}) {
        for (bool zstd : {false, true}) {
            for (bool feedback : {false, true}) {
                INFO("chunk " << f.chunk << " zstd " << zstd << " feedback " << feedback);
                const MessagePlan plan = make_plan(m, PlanKind::Delta, Codec::TOPK, f);
                std::vector<float> residual = normal_arena(m.total(), 4, 1e-4f);
                std::vector<float> residual_direct = residual;
                const std::vector<float> expected =
                    direct_sparse(f, x, 0.95f, kKey, feedback ? &residual_direct : nullptr);
                MessageEncoder encoder(plan, kKey, x.data(), feedback ? residual.data() : nullptr,
                                       zstd, feedback ? 0.95f : 1.0f);
                const EncodedMessage message = encode_to_end(encoder);
                CHECK(le(message.header, 8, 2) == f.chunk);
                CHECK(le(message.header, 52, 4) == (f.keep | f.value_bits << 16));
                if (!zstd) {
                    CHECK(message.bytes() == kHeaderBytes +
                                                 kChunkHeaderBytes * message.chunks.size() +
                                                 sparse_encoded_bytes(f, m.total()));
                }
                std::vector<float> got(m.total(), -1.0f);
                MessageDecoder decoder(m.fingerprint(), m, got.data(), got.size());
                decode_to_end(message.header, message.chunks, decoder);
                CHECK(decoder.header().sparse == f);
                CHECK(same_bits(got, expected));
                if (feedback) CHECK(same_bits(residual, residual_direct));
            }
        }
    }
}

TEST_CASE("a TOPK message above 4 MiB splits at whole sparse chunks") {
    // 3,474,688 parameters; every value kept in 8 bits: 88 bytes per 64 values, so a message
    // chunk holds floor(4 MiB / 88) = 47,662 sparse chunks (3,050,368 values).
    const ParameterManifest m(make_config(4, 256, 4, 768, 256));
    const std::vector<float> x = normal_arena(m.total(), 6);
    const SparseFormat f{64, 64, 8};
    CHECK(max_chunk_elements(Codec::TOPK, f) == 3'050'368);
    const Parts parts = encode_message(make_plan(m, PlanKind::Delta, Codec::TOPK, f), kKey,
                                       x.data(), nullptr, false);
    REQUIRE(parts.size() == 3);
    CHECK(le(parts[1], 16, 8) == 3'050'368);
    CHECK(le(parts[2], 8, 8) == 3'050'368);
    CHECK(le(parts[2], 16, 8) == m.total() - 3'050'368);
    std::vector<float> got(m.total());
    decode_message(parts, m.fingerprint(), m, got.data(), got.size());
    CHECK(same_bits(got, direct_sparse(f, x, 1.0f, kKey, nullptr)));
}

TEST_CASE("hostile TOPK headers and chunks are named") {
    const Parts good = topk_message();
    auto tampered = [&](const std::function<void(Parts&)>& change) {
        Parts p = good;
        change(p);
        reseal_all(p);
        return p;
    };
    expect_failure(tampered([](Parts& p) { set_le(p[0], 52, 2, 0); }), "keeps 0 values");
    expect_failure(tampered([](Parts& p) { set_le(p[0], 52, 2, 257); }), "keeps 257 values");
    expect_failure(tampered([](Parts& p) { set_le(p[0], 8, 2, 32); }), "outside [64, 32768]");
    expect_failure(tampered([](Parts& p) { set_le(p[0], 54, 1, 9); }), "values of 9 bits");
    expect_failure(tampered([](Parts& p) { p[0][6] = std::byte{1}; }), "not valid for a state");
    // Another format than the sender's: the chunk's length no longer matches.
    expect_failure(tampered([](Parts& p) { set_le(p[0], 52, 2, 9); }), "payload length");
    // A chunk's first sparse chunk with an inverted magnitude range (hi below lo).
    expect_failure(tampered([](Parts& p) { set_le(p[1], 48 + 4, 4, 0); }),
                   "TOPK chunk 0 (elements 0 to 255) has a magnitude range");
    // Q8 carries nothing in the TOPK field.
    Parts q8 = compressed_message();
    set_le(q8[0], 52, 4, 1);
    reseal_all(q8);
    expect_failure(q8, "reserved");

    std::vector<float> x(nano().total(), 0.0f), residual(nano().total(), 0.0f);
    CHECK_THROWS_WITH(MessageEncoder(make_plan(nano(), PlanKind::Delta, Codec::Q8), kKey, x.data(),
                                     residual.data(), false, 0.9f),
                      Catch::Matchers::Contains("feedback decay"));
    CHECK_THROWS_WITH(make_plan(nano(), PlanKind::Delta, Codec::TOPK, SparseFormat{64, 0, 2}),
                      Catch::Matchers::Contains("keeps 0 values"));
    CHECK_THROWS_WITH(make_plan(nano(), PlanKind::State, Codec::TOPK),
                      Catch::Matchers::Contains("not valid"));
}
