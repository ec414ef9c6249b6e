// The atomic file helpers: writes that replace a file whole or not at all, and whole-file reads.
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstddef>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/atomic_file.h"
#include "common/error.h"
#include "tests/support/files.h"

namespace fs = std::filesystem;
using namespace starling;
using namespace starling::test;

TEST_CASE("atomic_file: writes, replaces and leaves no temporary file", "[atomic_file]") {
    TempDir tmp;
    const fs::path p = tmp.path() / "state.json";
    write_file_atomic(p, std::string_view("first"));
    CHECK(read_file(p) == "first");
    write_file_atomic(p, std::string_view("second, longer"));
    CHECK(read_file(p) == "second, longer");

    const std::string a = "head|", b = "payload";
    write_file_atomic(p, {std::as_bytes(std::span(a)), std::as_bytes(std::span(b))});
    CHECK(read_file(p) == "head|payload");
    CHECK(slurp(p) == "head|payload");
    const std::vector<std::byte> raw = read_file_bytes(p);
    CHECK(std::string(reinterpret_cast<const char*>(raw.data()), raw.size()) == "head|payload");

    write_file_atomic(p, std::span<const std::byte>());
    CHECK(read_file(p).empty());
    CHECK(dir_names(tmp.path()) == std::vector<std::string>{"state.json"});

    // A relative path (no directory part) works too.
    const fs::path cwd = fs::current_path();
    fs::current_path(tmp.path());
    try {
        write_file_atomic("rel.txt", std::string_view("r"));
    } catch (...) {
        fs::current_path(cwd);
        throw;
    }
    fs::current_path(cwd);
    CHECK(read_file(tmp.path() / "rel.txt") == "r");
    CHECK(dir_names(tmp.path()) == std::vector<std::string>{"rel.txt", "state.json"});
}

TEST_CASE("atomic_file: failures throw, name the path and keep the old file", "[atomic_file]") {
    TempDir tmp;

    SECTION("target directory does not exist") {
        const fs::path p = tmp.path() / "no_such_dir" / "f.bin";
        try {
            write_file_atomic(p, std::string_view("x"));
            FAIL("no exception");
        } catch (const Error& e) {
            CHECK(std::string(e.what()).find(p.string()) != std::string::npos);
            CHECK(std::string(e.what()).find("No such file or directory") != std::string::npos);
        }
        CHECK(dir_names(tmp.path()).empty());
    }

    SECTION("rename fails: the target is a directory") {
        const fs::path p = tmp.path() / "taken";
        fs::create_directory(p);
        put(p / "inside", "keep");
        try {
            write_file_atomic(p, std::string_view("x"));
            FAIL("no exception");
        } catch (const Error& e) {
            CHECK(std::string(e.what()).find(p.string()) != std::string::npos);
            CHECK(std::string(e.what()).find("rename") != std::string::npos);
        }
        CHECK(dir_names(tmp.path()) == std::vector<std::string>{"taken"});
        CHECK(slurp(p / "inside") == "keep");
    }

    SECTION("write fails (file size limit standing in for a full disk)") {
        const fs::path p = tmp.path() / "big.bin";
        put(p, "old");
        struct rlimit old_limit {};
        REQUIRE(::getrlimit(RLIMIT_FSIZE, &old_limit) == 0);
        struct rlimit small = old_limit;
        small.rlim_cur = 4096;
        auto old_handler = ::signal(SIGXFSZ, SIG_IGN);  // get EFBIG instead of being killed
        REQUIRE(::setrlimit(RLIMIT_FSIZE, &small) == 0);
        std::string error;
        try {
            write_file_atomic(p, std::string(65536, 'x'));
        } catch (const Error& e) {
            error = e.what();
        }
        ::setrlimit(RLIMIT_FSIZE, &old_limit);
        ::signal(SIGXFSZ, old_handler);
        INFO(error);
        CHECK(error.find(p.string()) != std::string::npos);
        CHECK(error.find("cannot write") != std::string::npos);
        CHECK(error.find("too large") != std::string::npos);  // strerror(EFBIG): "File too large"
        CHECK(slurp(p) == "old");
        CHECK(dir_names(tmp.path()) == std::vector<std::string>{"big.bin"});
    }

    SECTION("read-only directory") {
        if (::geteuid() == 0) {
            WARN("running as root: permission checks do not apply, read-only case skipped");
            return;
        }
        const fs::path p = tmp.path() / "ro.bin";
        put(p, "old");
        fs::permissions(tmp.path(), fs::perms::owner_read | fs::perms::owner_exec);
        std::string error;
        try {
            write_file_atomic(p, std::string_view("new"));
        } catch (const Error& e) {
            error = e.what();
        }
        fs::permissions(tmp.path(), fs::perms::owner_all);
        CHECK(error.find(p.string()) != std::string::npos);
        CHECK(slurp(p) == "old");
        CHECK(dir_names(tmp.path()) == std::vector<std::string>{"ro.bin"});
    }

    SECTION("writer destroyed before commit") {
        const fs::path p = tmp.path() / "partial.bin";
        put(p, "old");
        {
            AtomicFileWriter w(p);
            w.write(std::string_view("half of the new"));
            CHECK(fs::exists(w.temp_path()));
            CHECK(w.temp_path().parent_path() == tmp.path());
            CHECK(w.bytes_written() == 15);
        }
        CHECK(slurp(p) == "old");
        CHECK(dir_names(tmp.path()) == std::vector<std::string>{"partial.bin"});
    }

    SECTION("read_file of a missing file") {
        const fs::path p = tmp.path() / "absent.txt";
        try {
            (void)read_file(p);
            FAIL("no exception");
        } catch (const Error& e) {
            CHECK(std::string(e.what()).find(p.string()) != std::string::npos);
            CHECK(std::string(e.what()).find("No such file") != std::string::npos);
        }
    }

    SECTION("fsync_directory of a missing directory") {
        CHECK_THROWS_AS(fsync_directory(tmp.path() / "nope"), Error);
        CHECK_NOTHROW(fsync_directory(tmp.path()));
    }
}
