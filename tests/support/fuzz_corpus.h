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

}  // namespace starling::test
