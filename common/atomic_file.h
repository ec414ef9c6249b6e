// Crash-safe file writes: the bytes go to a temporary file in the target's directory, which is
// fsynced and then renamed over the target, and the directory is fsynced, so after a crash the
// target holds either its old contents or the complete new ones, never a torn mix. Every failure
// throws starling::Error naming the file and the errno text, and removes the temporary file.
#pragma once

#include <cstddef>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace starling {

// Streams one file into place: construct (creates "<dir>/.<name>.tmp-<pid>-<n>"), write() any
// number of times, commit() to fsync, rename over the target and fsync the directory. Destroying
// it without a successful commit() (an exception, an early return) removes the temporary file
// and leaves the target untouched. A failed write() or commit() also removes it at once; the
// writer cannot be used afterwards.
class AtomicFileWriter {
public:
    explicit AtomicFileWriter(std::filesystem::path target);
    ~AtomicFileWriter();
    AtomicFileWriter(const AtomicFileWriter&) = delete;
    AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;

    void write(std::span<const std::byte> bytes);
    void write(std::string_view text) { write(std::as_bytes(std::span(text.data(), text.size()))); }
    void commit();

    const std::filesystem::path& target() const { return target_; }
    const std::filesystem::path& temp_path() const { return temp_; }
    size_t bytes_written() const { return written_; }

private:
    void abandon() noexcept;  // close and unlink the temporary file

    std::filesystem::path target_;
    std::filesystem::path temp_;
    int fd_ = -1;
    size_t written_ = 0;
};

// Whole-buffer conveniences over AtomicFileWriter. The vector form writes the buffers one after
// the other, so a header and a large payload need not be copied into one buffer first.
void write_file_atomic(const std::filesystem::path& path, std::span<const std::byte> bytes);
void write_file_atomic(const std::filesystem::path& path,
                       const std::vector<std::span<const std::byte>>& buffers);
void write_file_atomic(const std::filesystem::path& path, std::string_view text);

// fsync a directory so that entries created, renamed or removed in it are durable.
// Filesystems that cannot fsync a directory (EINVAL) are tolerated.
void fsync_directory(const std::filesystem::path& dir);

// fsync an existing regular file (opened read-only).
void fsync_file(const std::filesystem::path& path);

// The whole contents of a regular file; throws starling::Error naming the file if it is missing,
// not a regular file or unreadable.
std::string read_file(const std::filesystem::path& path);
std::vector<std::byte> read_file_bytes(const std::filesystem::path& path);

}  // namespace starling
