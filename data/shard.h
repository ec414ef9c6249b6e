// Token shards in the llm.c format: a header of 256 little-endian int32 (magic 20240520,
// version 1, token count, the rest zero) followed by count little-endian uint16 tokens.
// Shards are written atomically and read through a read-only memory map.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace starling {

// The token payload is mapped and used as uint16 directly, which assumes the file's byte order.
static_assert(std::endian::native == std::endian::little,
              "shards are little-endian and read in place; big-endian hosts are not supported");

inline constexpr int32_t kShardMagic = 20240520;
inline constexpr int32_t kShardVersion = 1;
inline constexpr size_t kShardHeaderInts = 256;
inline constexpr size_t kShardHeaderBytes = kShardHeaderInts * sizeof(int32_t);  // 1024

// Writes the header and tokens through write_file_atomic (a temporary file in the same directory,
// fsynced and renamed over path, then the directory fsynced), so a crash leaves either the old
// file or the complete new one. Throws Error on any I/O failure, for
// an empty span or for more tokens than an int32 count can hold.
void write_shard(const std::string& path, std::span<const uint16_t> tokens);

// A shard opened read-only through mmap. The constructor validates the whole file (size, magic,
// version, token count against the file size) and throws Error naming the path and the problem.
class Shard {
public:
    explicit Shard(std::string path);
    ~Shard();
    Shard(Shard&& other) noexcept;
    Shard& operator=(Shard&& other) noexcept;
    Shard(const Shard&) = delete;
    Shard& operator=(const Shard&) = delete;

    const std::string& path() const { return path_; }
    size_t size() const { return count_; }
    std::span<const uint16_t> tokens() const { return {tokens_, count_}; }
    uint16_t operator[](size_t i) const { return tokens_[i]; }

private:
    void unmap() noexcept;

    std::string path_;
    void* map_ = nullptr;
    size_t map_bytes_ = 0;
    const uint16_t* tokens_ = nullptr;
    size_t count_ = 0;
};

// The shard file name for a split and index: "<split>_000003.bin".
std::string shard_file_name(const std::string& split, size_t index);

// Paths of the regular files named <split>_*.bin in dir, sorted by name. Throws Error when dir is
// missing or not a directory, or holds no such file.
std::vector<std::string> list_shards(const std::string& dir, const std::string& split);

}  // namespace starling
