// Helpers shared by the data tests: a self-removing temporary directory, raw file I/O, and
// capturing the message of a starling::Error.
#pragma once

#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "common/error.h"

namespace starling_test {

namespace fs = std::filesystem;

class TempDir {
public:
    TempDir() {
        static std::atomic<int> counter{0};
        path_ = fs::temp_directory_path() /
                ("starling-test-data-" + std::to_string(::getpid()) + "-" + std::to_string(counter++));
        fs::remove_all(path_);
        fs::create_directories(path_);
    }
    ~TempDir() {
        std::error_code ec;
        fs::remove_all(path_, ec);
    }
    TempDir(const TempDir&) = delete;
    TempDir& operator=(const TempDir&) = delete;

    const fs::path& path() const { return path_; }
    std::string str() const { return path_.string(); }
    std::string file(const std::string& name) const { return (path_ / name).string(); }

private:
    fs::path path_;
};

inline void write_bytes(const std::string& path, const std::vector<unsigned char>& bytes) {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    REQUIRE(out.good());
    out.write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
    REQUIRE(out.good());
}

inline std::vector<unsigned char> read_bytes(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    REQUIRE(in.good());
    return std::vector<unsigned char>(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

inline void append_le32(std::vector<unsigned char>& out, uint32_t v) {
    for (int i = 0; i < 4; ++i) out.push_back(static_cast<unsigned char>((v >> (8 * i)) & 0xff));
}

inline void append_le16(std::vector<unsigned char>& out, uint16_t v) {
    out.push_back(static_cast<unsigned char>(v & 0xff));
    out.push_back(static_cast<unsigned char>(v >> 8));
}

// A shard file built byte by byte, independently of write_shard.
inline std::vector<unsigned char> raw_shard(int32_t magic, int32_t version, int32_t count,
                                            const std::vector<uint16_t>& tokens) {
    std::vector<unsigned char> bytes;
    append_le32(bytes, uint32_t(magic));
    append_le32(bytes, uint32_t(version));
    append_le32(bytes, uint32_t(count));
    for (int i = 3; i < 256; ++i) append_le32(bytes, 0);
    for (uint16_t t : tokens) append_le16(bytes, t);
    return bytes;
}

// The message of the starling::Error that f throws; fails the test if it throws nothing.
template <typename F>
std::string error_message(F&& f) {
    try {
        f();
    } catch (const starling::Error& e) {
        return e.what();
    }
    FAIL("expected a starling::Error");
    return {};
}

// Deterministic test data without <random>'s implementation-defined distributions.
inline std::vector<uint16_t> pseudo_random_tokens(size_t n, uint64_t seed) {
    std::vector<uint16_t> tokens(n);
    uint64_t x = seed * 6364136223846793005ULL + 1442695040888963407ULL;
    for (size_t i = 0; i < n; ++i) {
        x = x * 6364136223846793005ULL + 1442695040888963407ULL;
        tokens[i] = static_cast<uint16_t>(x >> 48);
    }
    return tokens;
}

}  // namespace starling_test
