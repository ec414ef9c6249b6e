// A directory of checkpoints, one subdirectory per step named step_%08d (step_00001200). A
// checkpoint is written into a hidden staging directory and renamed into place only once all its
// files are fsynced, so every step_* directory is complete: a crash leaves at worst a hidden
// leftover (.staging-*, .old-*, .trash-*), which latest() and list() ignore and the constructor
// cleans up. One process writes a given root at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace starling {

class CheckpointDir {
public:
    // keep_last: how many complete checkpoints save() keeps (the newest by step); 0 keeps all.
    // If root exists, leftovers of an interrupted save are recovered or removed: a step whose
    // replacement was cut short between its two renames is restored from .old-step_*, and
    // .staging-*, .trash-* and superseded .old-* directories are deleted. root itself is
    // created by the first save().
    CheckpointDir(std::filesystem::path root, size_t keep_last);

    // Writes checkpoint `step`: creates root if needed, makes a fresh root/.staging-step_%08d,
    // calls write_files(staging) to fill it, fsyncs every file and directory in it, renames it to
    // root/step_%08d (an existing one for that step is first renamed aside and removed after the
    // new one is in place), fsyncs root, then deletes the oldest checkpoints beyond keep_last
    // (never the one just written). Returns the final directory. If write_files or any step
    // before the rename throws, the staging directory is removed, existing checkpoints are
    // untouched and the exception propagates (I/O failures as starling::Error). A failure to
    // delete an old checkpoint is logged, not thrown.
    std::filesystem::path save(
        uint64_t step,
        const std::function<void(const std::filesystem::path& staging)>& write_files);

    // The newest complete checkpoint, or nullopt when there is none (or root does not exist).
    std::optional<std::filesystem::path> latest() const;
    // All complete checkpoints, sorted by step ascending. Only directories whose name is exactly
    // step_dir_name(step) for some step count; anything else in root is ignored.
    std::vector<std::pair<uint64_t, std::filesystem::path>> list() const;

    const std::filesystem::path& root() const { return root_; }
    size_t keep_last() const { return keep_last_; }

    static std::string step_dir_name(uint64_t step);  // "step_00001200"
    static std::optional<uint64_t> parse_step_dir_name(
        std::string_view name);  // canonical names only

private:
    void recover();
    void prune(uint64_t just_saved);

    std::filesystem::path root_;
    size_t keep_last_;
};

}  // namespace starling
