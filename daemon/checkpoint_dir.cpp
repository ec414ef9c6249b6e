#include "daemon/checkpoint_dir.h"

#include <algorithm>
#include <cinttypes>
#include <charconv>
#include <cstdio>
#include <system_error>

#include <spdlog/spdlog.h>

#include "common/error.h"
#include "common/atomic_file.h"

namespace starling {

namespace fs = std::filesystem;

namespace {

constexpr std::string_view kStepPrefix = "step_";
constexpr std::string_view kStagingPrefix = ".staging-";
constexpr std::string_view kOldPrefix = ".old-";
constexpr std::string_view kTrashPrefix = ".trash-";

[[noreturn]] void fail(const std::string& what, const fs::path& path, const std::error_code& ec) {
    throw Error("checkpoint: cannot " + what + " '" + path.string() + "': " + ec.message());
}

void remove_tree(const fs::path& path) {
    std::error_code ec;
    fs::remove_all(path, ec);
    if (ec) fail("remove", path, ec);
}

void rename_path(const fs::path& from, const fs::path& to) {
    std::error_code ec;
    fs::rename(from, to, ec);
    if (ec) {
        throw Error("checkpoint: cannot rename '" + from.string() + "' to '" + to.string() +
                    "': " + ec.message());
    }
}

bool path_exists(const fs::path& path) {
    std::error_code ec;
    bool present = fs::exists(fs::symlink_status(path, ec));
    if (ec && ec != std::errc::no_such_file_or_directory) fail("stat", path, ec);
    return present;
}

// fsync every regular file and directory under dir, and dir itself, so nothing the write_files
// callback wrote can be lost once the directory is renamed into place.
void sync_tree(const fs::path& dir) {
    std::error_code ec;
    fs::recursive_directory_iterator it(dir, ec), end;
    if (ec) fail("list", dir, ec);
    for (; it != end; it.increment(ec)) {
        if (ec) fail("list", dir, ec);
        fs::file_status st = it->symlink_status(ec);
        if (ec) fail("stat", it->path(), ec);
        if (fs::is_regular_file(st)) {
            fsync_file(it->path());
        } else if (fs::is_directory(st)) {
            fsync_directory(it->path());
        }
    }
    if (ec) fail("list", dir, ec);
    fsync_directory(dir);
}

// The step of a hidden leftover ".staging-step_00000012" etc., or nullopt for any other name.
std::optional<uint64_t> leftover_step(std::string_view name, std::string_view prefix) {
    if (name.substr(0, prefix.size()) != prefix) return std::nullopt;
    return CheckpointDir::parse_step_dir_name(name.substr(prefix.size()));
}

}  // namespace

std::string CheckpointDir::step_dir_name(uint64_t step) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "step_%08" PRIu64, step);
    return buf;
}

std::optional<uint64_t> CheckpointDir::parse_step_dir_name(std::string_view name) {
    if (name.substr(0, kStepPrefix.size()) != kStepPrefix) return std::nullopt;
    std::string_view digits = name.substr(kStepPrefix.size());
    if (digits.empty() ||
        !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; })) {
        return std::nullopt;
    }
    uint64_t step = 0;
    auto [ptr, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), step);
    if (ec != std::errc() || ptr != digits.data() + digits.size()) return std::nullopt;
    // Only the canonical spelling counts, so one step cannot have two directories.
    if (step_dir_name(step) != name) return std::nullopt;
    return step;
}

CheckpointDir::CheckpointDir(fs::path root, size_t keep_last)
    : root_(std::move(root)), keep_last_(keep_last) {
    recover();
}

void CheckpointDir::recover() {
    std::error_code ec;
    if (!fs::is_directory(root_, ec)) return;

    std::vector<fs::path> restore, discard;
    fs::directory_iterator it(root_, ec), end;
    if (ec) fail("list", root_, ec);
    for (; it != end; it.increment(ec)) {
        if (ec) fail("list", root_, ec);
        const std::string name = it->path().filename().string();
        if (auto step = leftover_step(name, kOldPrefix)) {
            // Replacing a step renames the old copy aside, then the new one into place. If the
            // second rename never happened the old copy is the only complete one: put it back.
            if (path_exists(root_ / step_dir_name(*step))) {
                discard.push_back(it->path());
            } else {
                restore.push_back(it->path());
            }
        } else if (leftover_step(name, kStagingPrefix) || leftover_step(name, kTrashPrefix)) {
            discard.push_back(it->path());
        }
    }
    if (ec) fail("list", root_, ec);
    if (restore.empty() && discard.empty()) return;

    for (const fs::path& old : restore) {
        const std::string name = old.filename().string().substr(kOldPrefix.size());
        spdlog::warn("checkpoint: restoring '{}' from an interrupted replacement",
                     (root_ / name).string());
        rename_path(old, root_ / name);
    }
    for (const fs::path& p : discard) {
        fs::remove_all(p, ec);
        if (ec)
            spdlog::warn("checkpoint: cannot remove leftover '{}': {}", p.string(), ec.message());
    }
    fsync_directory(root_);
}

std::vector<std::pair<uint64_t, fs::path>> CheckpointDir::list() const {
    std::vector<std::pair<uint64_t, fs::path>> out;
    std::error_code ec;
    if (!fs::is_directory(root_, ec)) return out;
    fs::directory_iterator it(root_, ec), end;
    if (ec) fail("list", root_, ec);
    for (; it != end; it.increment(ec)) {
        if (ec) fail("list", root_, ec);
        auto step = parse_step_dir_name(it->path().filename().string());
        if (!step) continue;
        std::error_code type_ec;
        if (!it->is_directory(type_ec)) continue;
        out.emplace_back(*step, it->path());
    }
    if (ec) fail("list", root_, ec);
    std::sort(out.begin(), out.end());
    return out;
}

std::optional<fs::path> CheckpointDir::latest() const {
    auto all = list();
    if (all.empty()) return std::nullopt;
    return all.back().second;
}

fs::path CheckpointDir::save(uint64_t step,
                             const std::function<void(const fs::path& staging)>& write_files) {
    const std::string name = step_dir_name(step);
    const fs::path staging = root_ / (std::string(kStagingPrefix) + name);
    fs::path target = root_ / name;
    const fs::path aside = root_ / (std::string(kOldPrefix) + name);

    std::error_code ec;
    fs::create_directories(root_, ec);
    if (ec) fail("create directory", root_, ec);
    remove_tree(staging);
    fs::create_directory(staging, ec);
    if (ec) fail("create directory", staging, ec);

    bool replaced = false;
    try {
        write_files(staging);
        sync_tree(staging);
        if (path_exists(target)) {
            remove_tree(aside);
            rename_path(target, aside);
            replaced = true;
        }
        rename_path(staging, target);
    } catch (...) {
        if (replaced) {
            fs::rename(aside, target, ec);  // best effort: put the old checkpoint back
            if (ec)
                spdlog::error("checkpoint: cannot restore '{}': {}", target.string(), ec.message());
        }
        fs::remove_all(staging, ec);
        throw;
    }
    fsync_directory(root_);
    if (replaced) {
        fs::remove_all(aside, ec);
        if (ec)
            spdlog::warn("checkpoint: cannot remove replaced '{}': {}", aside.string(),
                         ec.message());
    }
    prune(step);
    return target;
}

void CheckpointDir::prune(uint64_t just_saved) {
    if (keep_last_ == 0) return;
    auto all = list();
    if (all.size() <= keep_last_) return;
    size_t excess = all.size() - keep_last_;

    // Rename victims to hidden names first, make that durable, then delete: a crash mid-delete
    // must not leave a step_* directory with files missing.
    std::vector<fs::path> trash;
    std::error_code ec;
    for (const auto& [s, path] : all) {
        if (excess == 0) break;
        if (s == just_saved) continue;
        fs::path t = root_ / (std::string(kTrashPrefix) + step_dir_name(s));
        fs::remove_all(t, ec);
        fs::rename(path, t, ec);
        if (ec) {
            spdlog::warn("checkpoint: cannot remove old '{}': {}", path.string(), ec.message());
            continue;
        }
        trash.push_back(t);
        --excess;
    }
    if (trash.empty()) return;
    try {
        fsync_directory(root_);
    } catch (const Error& e) {
        spdlog::warn("{}", e.what());
    }
    for (const fs::path& t : trash) {
        fs::remove_all(t, ec);
        if (ec) spdlog::warn("checkpoint: cannot remove '{}': {}", t.string(), ec.message());
    }
}

}  // namespace starling
