// Helpers shared by the data tests: shard files built by hand, capturing the message of a
// starling::Error, and deterministic token data. Scratch directories and file I/O come from
// tests/support/files.h.
#pragma once

#include <catch2/catch.hpp>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/error.h"
#include "tests/support/files.h"

namespace starling::test {

inline void append_le32(std::string& out, uint32_t v) {
    for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

inline void append_le16(std::string& out, uint16_t v) {
    out.push_back(static_cast<char>(v & 0xff));
    out.push_back(static_cast<char>(v >> 8));
}

// The bytes of a shard file built byte by byte, independently of write_shard.
inline std::string raw_shard(int32_t magic, int32_t version, int32_t count,
                             const std::vector<uint16_t>& tokens) {
    std::string bytes;
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

}  // namespace starling::test
