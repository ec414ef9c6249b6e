// Scratch directories and whole-file I/O for the tests that touch the filesystem.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

namespace starling::test {

// A fresh, empty directory under the system temp directory, removed with everything in it when
// the object goes away. The name holds the pid, a per-process counter and a random number, so
// concurrent test processes and several instances in one process never share a directory.
class TempDir {
public:
    TempDir() {
        static std::atomic<unsigned long> counter{0};
        std::random_device random;
        path_ = std::filesystem::temp_directory_path() /
                ("starling-test-" + std::to_string(::getpid()) + "-" + std::to_string(random()) +
                 "-" + std::to_string(counter++));
        if (!std::filesystem::create_directory(path_)) {
            throw std::runtime_error("temporary directory " + path_.string() + " already exists");
        }
    }
    ~TempDir() {
        // A test may have left a directory read-only; give the owner access back first, or
        // remove_all cannot empty it.
        restore_access(path_);
        std::error_code ec;
        std::filesystem::remove_all(path_, ec);
    }
    TempDir(const TempDir&) = delete;
    TempDir& operator=(const TempDir&) = delete;

    const std::filesystem::path& path() const { return path_; }
    std::filesystem::path file(std::string_view name) const { return path_ / name; }

private:
    // Best effort: adds owner rwx to dir and every directory below it.
    static void restore_access(const std::filesystem::path& dir) noexcept {
        std::error_code ec;
        std::filesystem::permissions(dir, std::filesystem::perms::owner_all,
                                     std::filesystem::perm_options::add, ec);
        for (std::filesystem::directory_iterator it(dir, ec), end; !ec && it != end;
             it.increment(ec)) {
            std::error_code type_ec;
            if (it->is_directory(type_ec) && !it->is_symlink(type_ec)) restore_access(it->path());
        }
    }

    std::filesystem::path path_;
};

// The whole contents of a file; fails the test if it cannot be opened.
inline std::string slurp(const std::filesystem::path& p) {
    std::ifstream in(p, std::ios::binary);
    REQUIRE(in.good());
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// Creates or truncates a file holding exactly bytes; fails the test if that does not work.
inline void put(const std::filesystem::path& p, std::string_view bytes) {
    std::ofstream out(p, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    REQUIRE(out.good());
}

// The names of the entries in a directory, sorted.
inline std::vector<std::string> dir_names(const std::filesystem::path& dir) {
    std::vector<std::string> names;
    for (const auto& entry : std::filesystem::directory_iterator(dir)) {
        names.push_back(entry.path().filename().string());
    }
    std::sort(names.begin(), names.end());
    return names;
}

}  // namespace starling::test
