// The committed inputs of a fuzz target's corpus, which its test suite replays through the same
// entry point as the libFuzzer binary (scripts/fuzz) so that every input the fuzzer once found
// stays a regression test.
#pragma once

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

#include <catch2/catch.hpp>

namespace starling::test {

struct CorpusInput {
    std::string name;  // the file's name
    std::vector<uint8_t> bytes;
};

// Every regular file of dir, in name order (stable across file systems).
inline std::vector<CorpusInput> read_fuzz_corpus(const std::filesystem::path& dir) {
    std::vector<CorpusInput> inputs;
    for (const std::filesystem::directory_entry& entry : std::filesystem::directory_iterator(dir)) {
        if (!entry.is_regular_file()) continue;
        std::ifstream in(entry.path(), std::ios::binary);
        inputs.push_back({entry.path().filename().string(),
                          {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()}});
    }
    std::sort(inputs.begin(), inputs.end(),
              [](const CorpusInput& a, const CorpusInput& b) { return a.name < b.name; });
    return inputs;
}

struct CorpusReplay {
    size_t files = 0;
    size_t valid_seeds = 0;  // files named seed-valid-*
};

// Replays every input of dir through `valid`, the fuzz target's body (its LLVMFuzzerTestOneInput
// calls it and traps on a bug), and checks the seeds: a file named seed-valid-* must be valid, any
// other seed-* not; inputs the fuzzer found need only not crash.
template <typename Valid>
CorpusReplay replay_fuzz_corpus(const std::filesystem::path& dir, Valid valid) {
    REQUIRE(std::filesystem::is_directory(dir));
    CorpusReplay replay;
    for (const CorpusInput& input : read_fuzz_corpus(dir)) {
        INFO(input.name);
        const bool was_valid = valid(input.bytes.data(), input.bytes.size());
        const bool expect_valid = input.name.rfind("seed-valid-", 0) == 0;
        if (input.name.rfind("seed-", 0) == 0) CHECK(was_valid == expect_valid);
        replay.valid_seeds += expect_valid;
        replay.files++;
    }
    return replay;
}

}  // namespace starling::test
