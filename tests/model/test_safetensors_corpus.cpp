// The safetensors fuzz corpus (tests/model/safetensors-corpus) as a regression test, through the
// libFuzzer target's entry point. The hidden test tagged [.generate] writes the seeds:
// `test_model "[.generate]"`.
#include <catch2/catch.hpp>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "model/safetensors.h"
#include "tests/support/fuzz_corpus.h"

// tests/model/fuzz_safetensors.cpp, compiled into this suite as into the fuzzer.
bool fuzz_safetensors_valid(const uint8_t* data, size_t size);

using namespace starling;

namespace {

namespace fs = std::filesystem;
const fs::path kCorpus = fs::path(STARLING_SOURCE_DIR) / "tests" / "model" / "safetensors-corpus";

}  // namespace

TEST_CASE("every safetensors fuzz input reads or fails cleanly, valid seeds completely") {
    const test::CorpusReplay replay = test::replay_fuzz_corpus(kCorpus, fuzz_safetensors_valid);
    CHECK(replay.files >= 8);
    CHECK(replay.valid_seeds >= 3);
}

TEST_CASE("write the seed corpus for the safetensors fuzzer", "[.generate]") {
    fs::create_directories(kCorpus);
    const fs::path scratch = fs::temp_directory_path() / "starling-safetensors-seed.safetensors";
    const auto written = [&](const std::vector<TensorRef>& tensors,
                             const std::map<std::string, std::string>& metadata) {
        write_safetensors(scratch, tensors, metadata);
        std::ifstream in(scratch, std::ios::binary);
        std::string bytes{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
        fs::remove(scratch);
        return bytes;
    };
    const auto save = [&](const std::string& name, const std::string& bytes) {
        std::ofstream out(kCorpus / ("seed-" + name), std::ios::binary | std::ios::trunc);
        out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
        REQUIRE(out.good());
    };
    const std::vector<float> f(6, 0.5f);
    const std::vector<uint16_t> bf(4, 0x3f80);
    const std::vector<int64_t> i64{1, -2, 3};
    const std::string two = written({{"a.weight", DType::F32, {2, 3}, f.data()},
                                     {"b", DType::BF16, {4}, bf.data()},
                                     {"steps", DType::I64, {3}, i64.data()}},
                                    {{"format", "pt"}, {"round", "7"}});
    save("valid-three-tensors", two);
    save("valid-scalar", written({{"s", DType::F32, {}, f.data()}}, {}));
    save("valid-empty-tensor", written({{"e", DType::F32, {0, 4}, nullptr}}, {}));
    REQUIRE(fuzz_safetensors_valid(reinterpret_cast<const uint8_t*>(two.data()), two.size()));

    save("broken-empty", "");
    save("broken-length-only", two.substr(0, 8));
    save("broken-truncated-header", two.substr(0, 40));
    save("broken-truncated-data", two.substr(0, two.size() - 3));
    std::string huge = two;
    huge[5] = '\x7f';  // header length far past the file
    save("broken-header-length", huge);
    std::string offsets = two;
    const size_t at = offsets.find("\"data_offsets\":[0,24]");
    REQUIRE(at != std::string::npos);
    offsets.replace(at, 21, "\"data_offsets\":[0,28]");
    save("broken-offsets-overlap", offsets);
    std::string dtype = two;
    dtype.replace(dtype.find("\"BF16\""), 6, "\"BF17\"");
    save("broken-dtype", dtype);
}
