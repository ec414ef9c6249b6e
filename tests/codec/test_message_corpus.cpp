// The fuzz corpus (tests/codec/corpus) as a regression test: every input, seeds and whatever
// scripts/fuzz merged, goes through the same entry point as the libFuzzer target. The hidden test
// tagged [.generate] writes the seeds: `test_codec "[.generate]"`.
#include <catch2/catch.hpp>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "model/manifest.h"
#include "codec/message.h"
#include "tests/support/fuzz_corpus.h"

// tests/codec/fuzz_decode.cpp, compiled into this suite as into the fuzzer.
bool fuzz_decode_complete(const uint8_t* data, size_t size);
const starling::ParameterManifest& fuzz_decode_manifest();

using namespace starling;
using namespace starling::codec;

namespace {

namespace fs = std::filesystem;

const fs::path kCorpus = fs::path(STARLING_SOURCE_DIR) / "tests" / "codec" / "corpus";
constexpr size_t kMinCorpusFiles = 20;

// The fuzz input format: a mode byte, then each part as a little-endian u32 length and its bytes.
std::vector<uint8_t> frame(uint8_t mode, const std::vector<std::vector<std::byte>>& parts) {
    std::vector<uint8_t> out{mode};
    for (const auto& p : parts) {
        for (int i = 0; i < 4; i++) out.push_back(static_cast<uint8_t>(p.size() >> (8 * i)));
        for (std::byte b : p) out.push_back(static_cast<uint8_t>(b));
    }
    return out;
}

}  // namespace

TEST_CASE("every fuzz corpus input decodes or fails cleanly, valid seeds completely") {
    const test::CorpusReplay replay = test::replay_fuzz_corpus(kCorpus, fuzz_decode_complete);
    CHECK(replay.files >= kMinCorpusFiles);
    CHECK(replay.valid_seeds >= 8);
}

TEST_CASE("write the seed corpus for the message fuzzer", "[.generate]") {
    const ParameterManifest& m = fuzz_decode_manifest();
    const size_t n = m.total();
    std::mt19937 rng(11);
    std::normal_distribution<float> normal(0.0f, 0.05f);
    std::vector<float> dense(n), sparse(n, 0.0f);
    for (float& v : dense) v = normal(rng);
    for (size_t i = 0; i < n; i += 37) sparse[i] = normal(rng);
    const RoundingKey key{77, 5, 1};

    fs::create_directories(kCorpus);
    size_t written = 0;
    auto save = [&](const std::string& name, const std::vector<uint8_t>& bytes) {
        std::ofstream out(kCorpus / ("seed-" + name), std::ios::binary | std::ios::trunc);
        out.write(reinterpret_cast<const char*>(bytes.data()),
                  static_cast<std::streamsize>(bytes.size()));
        REQUIRE(out.good());
        written++;
    };
    // TOPK in small chunks (64 values, 4 kept), so a message has many for mutations to reach.
    auto message = [&](PlanKind kind, Codec codec, const std::vector<float>& x, bool zstd,
                       bool feedback = false, uint32_t value_bits = 2) {
        std::vector<float> residual(n, 0.001f);
        return encode_message(make_plan(m, kind, codec, SparseFormat{64, 4, value_bits}), key,
                              x.data(), feedback ? residual.data() : nullptr, zstd);
    };

    // Valid messages, each codec, raw and compressed. Mode 3 (reseal checksums) lets mutations
    // reach past the checksums; a couple keep mode 0.
    struct Valid {
        const char* name;
        PlanKind kind;
        Codec codec;
        bool sparse, zstd, feedback;
        uint8_t mode;
    };
    const Valid valid[] = {
        {"delta-q8", PlanKind::Delta, Codec::Q8, false, false, false, 3},
        {"delta-q8-zstd", PlanKind::Delta, Codec::Q8, true, true, false, 3},
        {"delta-q8-raw-mode0", PlanKind::Delta, Codec::Q8, false, false, false, 0},
        {"delta-q4-feedback", PlanKind::Delta, Codec::Q4, false, false, true, 3},
        {"delta-q4-zstd", PlanKind::Delta, Codec::Q4, true, true, true, 3},
        {"delta-f32", PlanKind::Delta, Codec::F32, false, false, false, 3},
        {"delta-f32-zstd", PlanKind::Delta, Codec::F32, true, true, false, 3},
        {"state-bf16sr", PlanKind::State, Codec::BF16SR, false, false, false, 3},
        {"state-bf16sr-zstd", PlanKind::State, Codec::BF16SR, true, true, false, 3},
        {"state-bf16sr-mode0", PlanKind::State, Codec::BF16SR, false, true, false, 0},
        {"state-q8", PlanKind::State, Codec::Q8, false, false, false, 3},
        {"state-q8-zstd", PlanKind::State, Codec::Q8, true, true, false, 3},
        {"state-f32-zstd", PlanKind::State, Codec::F32, true, true, false, 3},
        {"delta-topk", PlanKind::Delta, Codec::TOPK, false, false, false, 3},
        {"delta-topk-zstd", PlanKind::Delta, Codec::TOPK, true, true, true, 3},
        {"delta-topk-mode0", PlanKind::Delta, Codec::TOPK, false, false, false, 0},
    };
    for (const Valid& v : valid) {
        const auto parts =
            message(v.kind, v.codec, v.sparse ? sparse : dense, v.zstd, v.feedback, v.zstd ? 4 : 2);
        const std::vector<uint8_t> bytes = frame(v.mode, parts);
        REQUIRE(fuzz_decode_complete(bytes.data(), bytes.size()));
        save(std::string("valid-") + v.name, bytes);
    }

    // Broken ones.
    const auto state = message(PlanKind::State, Codec::Q8, dense, false);
    const auto packed = message(PlanKind::Delta, Codec::Q8, sparse, true);
    REQUIRE(state.size() == 3);  // header, the embedding as Q8, the rest as F32
    save("broken-empty", {});
    save("broken-mode-only", {3});
    save("broken-header-only", frame(3, {state[0]}));
    save("broken-header-truncated",
         frame(0, {std::vector<std::byte>(state[0].begin(), state[0].begin() + 40)}));
    {
        auto p = state;
        p[0][0] = std::byte{'X'};
        save("broken-bad-magic", frame(1, p));
    }
    {
        auto p = state;
        p[0][16] = std::byte{1};  // element count
        save("broken-element-count", frame(3, p));
    }
    {
        auto p = state;
        p[0][24] ^= std::byte{1};  // fingerprint
        save("broken-fingerprint", frame(3, p));
    }
    {
        auto p = state;
        p[2].resize(p[2].size() - 10);
        save("broken-chunk-truncated", frame(3, p));
    }
    {
        auto p = state;
        std::swap(p[1], p[2]);
        save("broken-chunks-swapped", frame(3, p));
    }
    {
        auto p = state;
        p[1][60] ^= std::byte{0x40};
        save("broken-payload-checksum", frame(0, p));
    }
    {
        auto p = state;
        for (size_t i = 48; i < p[1].size(); i++) p[1][i] = std::byte{0xff};  // NaN scales
        save("broken-nan-scales", frame(3, p));
    }
    {
        auto p = state;
        p[1][32] = std::byte{1};  // claims zstd, header says no
        save("broken-zstd-flag-no-header", frame(3, p));
    }
    {
        auto p = packed;
        for (size_t i = 56; i < p[1].size(); i += 5) p[1][i] ^= std::byte{0x21};
        save("broken-zstd-corrupt", frame(3, p));
    }
    {
        auto p = state;
        p.push_back(p[1]);
        save("broken-chunk-after-completion", frame(3, p));
    }
    {
        auto p = state;
        p[1][4] = std::byte{200};  // segment index
        save("broken-segment-index", frame(3, p));
    }
    CHECK(written >= kMinCorpusFiles);
}
