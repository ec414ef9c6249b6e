#include "common/atomic_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <system_error>
#include <utility>

#include "common/errno_text.h"
#include "common/error.h"

namespace starling {

namespace {

[[noreturn]] void fail(const std::string& what, const std::filesystem::path& path, int err) {
    throw Error(what + " '" + path.string() + "': " + errno_text(err));
}

std::filesystem::path directory_of(const std::filesystem::path& path) {
    std::filesystem::path dir = path.parent_path();
    return dir.empty() ? std::filesystem::path(".") : dir;
}

std::atomic<unsigned long> temp_counter{0};

// Closes a descriptor on scope exit (read paths only; the writer manages its own).
struct FdGuard {
    int fd;
    ~FdGuard() {
        if (fd >= 0) ::close(fd);
    }
};

// open(2) read-only, retried when a signal interrupts it; what names the kind of thing for errors.
int open_read_only(const std::filesystem::path& path, int extra_flags, const char* what) {
    int fd;
    do {
        fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | extra_flags);
    } while (fd < 0 && errno == EINTR);
    if (fd < 0) fail(std::string("cannot open ") + what, path, errno);
    return fd;
}

template <typename Buffer>
Buffer read_whole(const std::filesystem::path& path) {
    const int fd = open_read_only(path, 0, "file");
    FdGuard guard{fd};

    struct stat st {};
    if (::fstat(fd, &st) != 0) fail("cannot stat file", path, errno);
    if (!S_ISREG(st.st_mode)) {
        throw Error("cannot read '" + path.string() + "': not a regular file");
    }

    Buffer buf(static_cast<size_t>(st.st_size), typename Buffer::value_type{});
    size_t got = 0;
    while (got < buf.size()) {
        ssize_t n = ::read(fd, reinterpret_cast<char*>(buf.data()) + got,
                           std::min<size_t>(buf.size() - got, size_t{1} << 30));
        if (n < 0) {
            if (errno == EINTR) continue;
            fail("cannot read file", path, errno);
        }
        if (n == 0) break;  // the file shrank since fstat; return what is there
        got += static_cast<size_t>(n);
    }
    buf.resize(got);
    return buf;
}

}  // namespace

AtomicFileWriter::AtomicFileWriter(std::filesystem::path target) : target_(std::move(target)) {
    if (target_.filename().empty()) {
        throw Error("cannot write '" + target_.string() + "': no file name");
    }
    std::filesystem::path dir = directory_of(target_);
    for (int attempt = 0;; ++attempt) {
        std::string name = ".";
        name += target_.filename().string();
        name +=
            ".tmp-" + std::to_string(::getpid()) + "-" + std::to_string(temp_counter.fetch_add(1));
        temp_ = dir / name;
        fd_ = ::open(temp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
        if (fd_ >= 0) return;
        int err = errno;
        // A leftover from an earlier process with the same pid: try the next name.
        if ((err == EEXIST || err == EINTR) && attempt < 100) continue;
        fail("cannot create temporary file for", target_, err);
    }
}

AtomicFileWriter::~AtomicFileWriter() { abandon(); }

void AtomicFileWriter::abandon() noexcept {
    if (fd_ < 0) return;
    ::close(fd_);
    fd_ = -1;
    ::unlink(temp_.c_str());
}

void AtomicFileWriter::write(std::span<const std::byte> bytes) {
    if (fd_ < 0) throw Error("cannot write '" + target_.string() + "': writer already closed");
    const char* p = reinterpret_cast<const char*>(bytes.data());
    size_t left = bytes.size();
    while (left > 0) {
        ssize_t n = ::write(fd_, p, std::min<size_t>(left, size_t{1} << 30));
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
            int err = n < 0 ? errno : ENOSPC;
            abandon();
            fail("cannot write", target_, err);
        }
        p += n;
        left -= static_cast<size_t>(n);
        written_ += static_cast<size_t>(n);
    }
}

void AtomicFileWriter::commit() {
    if (fd_ < 0) throw Error("cannot commit '" + target_.string() + "': writer already closed");
    if (::fsync(fd_) != 0) {
        int err = errno;
        abandon();
        fail("cannot fsync", target_, err);
    }
    int fd = std::exchange(fd_, -1);
    if (::close(fd) != 0 && errno != EINTR) {
        int err = errno;
        ::unlink(temp_.c_str());
        fail("cannot close", target_, err);
    }
    if (::rename(temp_.c_str(), target_.c_str()) != 0) {
        int err = errno;
        ::unlink(temp_.c_str());
        fail("cannot rename temporary file over", target_, err);
    }
    fsync_directory(directory_of(target_));
}

void write_file_atomic(const std::filesystem::path& path, std::span<const std::byte> bytes) {
    AtomicFileWriter w(path);
    w.write(bytes);
    w.commit();
}

void write_file_atomic(const std::filesystem::path& path,
                       const std::vector<std::span<const std::byte>>& buffers) {
    AtomicFileWriter w(path);
    for (const auto& b : buffers) w.write(b);
    w.commit();
}

void write_file_atomic(const std::filesystem::path& path, std::string_view text) {
    write_file_atomic(path, std::as_bytes(std::span(text.data(), text.size())));
}

void fsync_directory(const std::filesystem::path& dir) {
    FdGuard guard{open_read_only(dir, O_DIRECTORY, "directory")};
    const int fd = guard.fd;
    if (::fsync(fd) != 0 && errno != EINVAL) fail("cannot fsync directory", dir, errno);
}

void fsync_file(const std::filesystem::path& path) {
    FdGuard guard{open_read_only(path, 0, "file")};
    if (::fsync(guard.fd) != 0 && errno != EINVAL) fail("cannot fsync file", path, errno);
}

std::string read_file(const std::filesystem::path& path) { return read_whole<std::string>(path); }

std::vector<std::byte> read_file_bytes(const std::filesystem::path& path) {
    return read_whole<std::vector<std::byte>>(path);
}

}  // namespace starling
