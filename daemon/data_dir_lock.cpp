#include "daemon/data_dir_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "common/errno_text.h"
#include "common/error.h"

namespace starling {
namespace {

std::filesystem::path lock_path(const std::filesystem::path& data_dir) { return data_dir / "LOCK"; }

// The holder's PID as its LOCK file says it, or "another process" when the file is empty (the
// holder is between taking the lock and writing its PID).
std::string holder_named_in(int fd) {
    char text[32] = {};
    const ssize_t n = pread(fd, text, sizeof(text) - 1, 0);
    std::string pid = n > 0 ? std::string(text, static_cast<size_t>(n)) : "";
    while (!pid.empty() && (pid.back() == '\n' || pid.back() == ' ')) pid.pop_back();
    return pid.empty() ? "another process" : "PID " + pid;
}

}  // namespace

DataDirLock::DataDirLock(const std::filesystem::path& data_dir) {
    const std::string path = lock_path(data_dir).string();
    fd_ = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ < 0) throw Error("[node].data_dir: cannot open " + path + ": " + errno_text(errno));
    if (flock(fd_, LOCK_EX | LOCK_NB) != 0) {
        const int error = errno;
        const std::string holder = error == EWOULDBLOCK ? holder_named_in(fd_) : "";
        close(fd_);
        if (error != EWOULDBLOCK)
            throw Error("[node].data_dir: cannot lock " + path + ": " + errno_text(error));
        throw Error("[node].data_dir " + data_dir.string() + " is in use by another starlingd (" +
                    holder + " holds " + path + "): give each node a data directory of its own");
    }
    const std::string pid = std::to_string(getpid()) + "\n";
    if (ftruncate(fd_, 0) != 0 ||
        pwrite(fd_, pid.data(), pid.size(), 0) != static_cast<ssize_t>(pid.size())) {
        const int error = errno;
        close(fd_);
        throw Error("[node].data_dir: cannot write " + path + ": " + errno_text(error));
    }
}

DataDirLock::~DataDirLock() { close(fd_); }

std::optional<std::string> data_dir_lock_holder(const std::filesystem::path& data_dir) {
    const std::string path = lock_path(data_dir).string();
    const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return std::nullopt;
    std::optional<std::string> holder;
    // A shared lock is granted unless a daemon holds the exclusive one; it is dropped at once.
    if (flock(fd, LOCK_SH | LOCK_NB) != 0 && errno == EWOULDBLOCK) holder = holder_named_in(fd);
    close(fd);
    return holder;
}

}  // namespace starling
