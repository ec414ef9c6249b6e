#include "data/shard.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <system_error>
#include <utility>

#include "common/atomic_file.h"
#include "common/errno_text.h"
#include "common/error.h"

namespace starling {

namespace fs = std::filesystem;

namespace {

// Closes a file descriptor on scope exit (the reader's; writes go through AtomicFileWriter).
class FdGuard {
public:
    explicit FdGuard(int fd) : fd_(fd) {}
    ~FdGuard() {
        if (fd_ >= 0) ::close(fd_);
    }
    FdGuard(const FdGuard&) = delete;
    FdGuard& operator=(const FdGuard&) = delete;

private:
    int fd_;
};

void put_le32(unsigned char* dst, int32_t value) {
    uint32_t v = static_cast<uint32_t>(value);
    for (int i = 0; i < 4; ++i) dst[i] = static_cast<unsigned char>(v >> (8 * i));
}

int32_t get_le32(const unsigned char* src) {
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) v |= uint32_t(src[i]) << (8 * i);
    return static_cast<int32_t>(v);
}

}  // namespace

void write_shard(const std::string& path, std::span<const uint16_t> tokens) {
    if (tokens.empty()) throw Error(path + ": refusing to write an empty shard (0 tokens)");
    if (tokens.size() > size_t(std::numeric_limits<int32_t>::max())) {
        throw Error(path + ": " + std::to_string(tokens.size()) +
                    " tokens do not fit the int32 count of the shard header");
    }

    unsigned char header[kShardHeaderBytes] = {};
    put_le32(header + 0, kShardMagic);
    put_le32(header + 4, kShardVersion);
    put_le32(header + 8, static_cast<int32_t>(tokens.size()));

    write_file_atomic(path, {std::as_bytes(std::span(header)), std::as_bytes(tokens)});
}

Shard::Shard(std::string path) : path_(std::move(path)) {
    int fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        int err = errno;
        if (err == ENOENT) throw Error(path_ + ": no such file");
        throw Error(path_ + ": cannot open: " + errno_text(err));
    }
    FdGuard guard(fd);
    struct stat st {};
    if (::fstat(fd, &st) != 0) throw Error(path_ + ": cannot stat: " + errno_text(errno));
    if (!S_ISREG(st.st_mode)) throw Error(path_ + ": not a regular file");
    const size_t file_bytes = static_cast<size_t>(st.st_size);
    if (file_bytes < kShardHeaderBytes) {
        throw Error(path_ + ": too short for the shard header: the file is " +
                    std::to_string(file_bytes) + " bytes, the header alone is " +
                    std::to_string(kShardHeaderBytes));
    }

    void* map = ::mmap(nullptr, file_bytes, PROT_READ, MAP_PRIVATE, fd, 0);
    if (map == MAP_FAILED) throw Error(path_ + ": mmap failed: " + errno_text(errno));
    map_ = map;
    map_bytes_ = file_bytes;

    try {
        const auto* header = static_cast<const unsigned char*>(map_);
        const int32_t magic = get_le32(header + 0);
        const int32_t version = get_le32(header + 4);
        const int32_t count = get_le32(header + 8);
        if (magic != kShardMagic) {
            throw Error(path_ + ": bad magic number " + std::to_string(magic) + ", expected " +
                        std::to_string(kShardMagic) + " (not an llm.c token shard)");
        }
        if (version != kShardVersion) {
            throw Error(path_ + ": unsupported version " + std::to_string(version) +
                        ", this build reads version " + std::to_string(kShardVersion));
        }
        if (count < 0)
            throw Error(path_ + ": corrupt header: negative token count " + std::to_string(count));
        if (count == 0) throw Error(path_ + ": empty shard: header says 0 tokens");

        const size_t expected = kShardHeaderBytes + sizeof(uint16_t) * size_t(count);
        const size_t payload = file_bytes - kShardHeaderBytes;
        if (file_bytes < expected) {
            std::string held = std::to_string(payload / sizeof(uint16_t));
            if (payload % sizeof(uint16_t) != 0) held += " and a half";
            throw Error(path_ + ": truncated: header says " + std::to_string(count) +
                        " tokens but the file holds " + held);
        }
        if (file_bytes > expected) {
            throw Error(path_ + ": trailing bytes: header says " + std::to_string(count) +
                        " tokens (" + std::to_string(expected) + " bytes) but the file is " +
                        std::to_string(file_bytes) + " bytes (" +
                        std::to_string(file_bytes - expected) + " extra)");
        }
        tokens_ = reinterpret_cast<const uint16_t*>(header + kShardHeaderBytes);
        count_ = size_t(count);
    } catch (...) {
        unmap();
        throw;
    }
}

Shard::~Shard() { unmap(); }

Shard::Shard(Shard&& other) noexcept
    : path_(std::move(other.path_)),
      map_(std::exchange(other.map_, nullptr)),
      map_bytes_(std::exchange(other.map_bytes_, 0)),
      tokens_(std::exchange(other.tokens_, nullptr)),
      count_(std::exchange(other.count_, 0)) {}

Shard& Shard::operator=(Shard&& other) noexcept {
    if (this != &other) {
        unmap();
        path_ = std::move(other.path_);
        map_ = std::exchange(other.map_, nullptr);
        map_bytes_ = std::exchange(other.map_bytes_, 0);
        tokens_ = std::exchange(other.tokens_, nullptr);
        count_ = std::exchange(other.count_, 0);
    }
    return *this;
}

void Shard::unmap() noexcept {
    if (map_ != nullptr) ::munmap(map_, map_bytes_);
    map_ = nullptr;
    map_bytes_ = 0;
    tokens_ = nullptr;
    count_ = 0;
}

std::string shard_file_name(const std::string& split, size_t index) {
    char digits[32];
    std::snprintf(digits, sizeof(digits), "%06zu", index);
    return split + "_" + digits + ".bin";
}

std::vector<std::string> list_shards(const std::string& dir, const std::string& split) {
    const std::string hint = "; run `starling data prepare` first";
    std::error_code ec;
    fs::file_status st = fs::status(dir, ec);
    if (ec && ec != std::errc::no_such_file_or_directory) {
        throw Error(dir + ": cannot read the shard directory: " + ec.message());
    }
    if (!fs::exists(st)) throw Error(dir + ": shard directory does not exist" + hint);
    if (!fs::is_directory(st))
        throw Error(dir + ": not a directory (expected a directory of shards)");

    const std::string prefix = split + "_";
    const std::string suffix = ".bin";
    std::vector<std::string> paths;
    for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
        const std::string name = it->path().filename().string();
        if (name.size() < prefix.size() + suffix.size()) continue;
        if (!name.starts_with(prefix) || !name.ends_with(suffix)) continue;
        std::error_code type_ec;
        if (!it->is_regular_file(type_ec)) continue;
        paths.push_back(it->path().string());
    }
    if (ec) throw Error(dir + ": cannot list the shard directory: " + ec.message());
    if (paths.empty()) throw Error("no " + split + " shards in " + dir + hint);
    std::sort(paths.begin(), paths.end());
    return paths;
}

}  // namespace starling
