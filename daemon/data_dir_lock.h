// One daemon per data directory: starlingd holds flock(LOCK_EX) on <data_dir>/LOCK for as long as
// it runs, with its PID written in the file. Two daemons on one directory would share a node id
// and overwrite each other's checkpoints, so the second is refused at startup, naming the holder.
// The kernel drops the lock when the process dies, however it dies, so a stale LOCK file never
// blocks a restart.
#pragma once

#include <filesystem>
#include <optional>
#include <string>

namespace starling {

class DataDirLock {
public:
    // Takes the lock without waiting. Throws starling::Error naming the directory and the PID the
    // file names when another process holds it, or the errno text when the file cannot be opened.
    explicit DataDirLock(const std::filesystem::path& data_dir);
    ~DataDirLock();
    DataDirLock(const DataDirLock&) = delete;
    DataDirLock& operator=(const DataDirLock&) = delete;

private:
    int fd_ = -1;
};

// What holds the lock of data_dir: "PID 1234" (or "another process" when the file names none),
// or nullopt when nobody does, or the directory or its LOCK does not exist yet. Never throws:
// `starling check` reports it.
std::optional<std::string> data_dir_lock_holder(const std::filesystem::path& data_dir);

}  // namespace starling
