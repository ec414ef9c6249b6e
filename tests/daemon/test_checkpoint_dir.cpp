// CheckpointDir: staging, rename into place, retention and crash leftovers. Expectations are
// checked by listing the directory on disk, not only through the class's own list().
#include <catch2/catch.hpp>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <vector>

#include "daemon/checkpoint_dir.h"
#include "common/error.h"
#include "common/atomic_file.h"
#include "tests/support/files.h"

namespace fs = std::filesystem;
using namespace starling;
using namespace starling::test;

namespace {

// A writer that leaves a file naming the step (and a nested file, to exercise the fsync walk).
auto writer(const std::string& content) {
    return [content](const fs::path& staging) {
        write_file_atomic(staging / "state.txt", std::string_view(content));
        fs::create_directory(staging / "shards");
        put(staging / "shards" / "0.bin", content + "/0");
    };
}

}  // namespace

TEST_CASE("checkpoint_dir: step directory names", "[checkpoint_dir]") {
    CHECK(CheckpointDir::step_dir_name(0) == "step_00000000");
    CHECK(CheckpointDir::step_dir_name(1200) == "step_00001200");
    CHECK(CheckpointDir::step_dir_name(123456789) == "step_123456789");
    CHECK(CheckpointDir::parse_step_dir_name("step_00001200") == std::optional<uint64_t>(1200));
    CHECK(CheckpointDir::parse_step_dir_name("step_123456789") ==
          std::optional<uint64_t>(123456789));
    CHECK(CheckpointDir::parse_step_dir_name("step_18446744073709551615") ==
          std::optional<uint64_t>(UINT64_MAX));
    for (const char* junk :
         {"step_", "step_1200", "step_000001200", "step_0000120x", "step_-0000120", "step_+0000120",
          "Step_00001200", ".staging-step_00001200", "step_00001200 ", "step_18446744073709551616",
          "xstep_00001200"}) {
        INFO(junk);
        CHECK_FALSE(CheckpointDir::parse_step_dir_name(junk).has_value());
    }
}

TEST_CASE("checkpoint_dir: keeps the newest keep_last checkpoints", "[checkpoint_dir]") {
    TempDir tmp;
    const fs::path root = tmp.path() / "ckpt" / "run1";  // created by the first save
    CheckpointDir dir(root, 3);
    CHECK_FALSE(dir.latest().has_value());
    CHECK(dir.list().empty());

    for (uint64_t step : {100, 200, 300, 400, 500}) {
        fs::path got = dir.save(step, writer("step " + std::to_string(step)));
        CHECK(got == root / CheckpointDir::step_dir_name(step));
        CHECK(slurp(got / "state.txt") == "step " + std::to_string(step));
        REQUIRE(dir.latest().has_value());
        CHECK(*dir.latest() == got);
    }

    CHECK(dir_names(root) ==
          std::vector<std::string>{"step_00000300", "step_00000400", "step_00000500"});
    const auto all = dir.list();
    REQUIRE(all.size() == 3);
    CHECK(all[0] == std::pair<uint64_t, fs::path>(300, root / "step_00000300"));
    CHECK(all[1] == std::pair<uint64_t, fs::path>(400, root / "step_00000400"));
    CHECK(all[2] == std::pair<uint64_t, fs::path>(500, root / "step_00000500"));
    CHECK(*dir.latest() == root / "step_00000500");
    CHECK(slurp(root / "step_00000500" / "shards" / "0.bin") == "step 500/0");
    CHECK(slurp(root / "step_00000300" / "state.txt") == "step 300");

    // latest() orders by step number, not by name or time: a bigger step with more digits wins.
    dir.save(100000000, writer("big"));
    CHECK(*dir.latest() == root / "step_100000000");
    CHECK(dir_names(root) ==
          std::vector<std::string>{"step_00000400", "step_00000500", "step_100000000"});

    // Saving an older step than the newest never deletes the one just written.
    dir.save(50, writer("older"));
    CHECK(dir_names(root) ==
          std::vector<std::string>{"step_00000050", "step_00000500", "step_100000000"});
}

TEST_CASE("checkpoint_dir: keep_last 0 keeps everything", "[checkpoint_dir]") {
    TempDir tmp;
    CheckpointDir dir(tmp.path(), 0);
    for (uint64_t step = 1; step <= 4; ++step) dir.save(step, writer("s"));
    CHECK(dir.list().size() == 4);
    CHECK(dir_names(tmp.path()).size() == 4);
}

TEST_CASE("checkpoint_dir: a failing write_files leaves no trace", "[checkpoint_dir]") {
    TempDir tmp;
    CheckpointDir dir(tmp.path(), 3);
    dir.save(10, writer("ten"));
    dir.save(20, writer("twenty"));
    const auto before = dir_names(tmp.path());

    SECTION("a new step") {
        CHECK_THROWS_WITH(dir.save(30,
                                   [](const fs::path& staging) {
                                       put(staging / "half.bin", "partial");
                                       throw std::runtime_error("disk on fire");
                                   }),
                          "disk on fire");
    }
    SECTION("replacing an existing step") {
        CHECK_THROWS_AS(dir.save(20,
                                 [](const fs::path& staging) {
                                     put(staging / "state.txt", "bad");
                                     throw Error("serialisation failed");
                                 }),
                        Error);
        CHECK(slurp(tmp.path() / "step_00000020" / "state.txt") == "twenty");
    }
    CHECK(dir_names(tmp.path()) == before);
    CHECK(*dir.latest() == tmp.path() / "step_00000020");
    CHECK(dir.list().size() == 2);
}

TEST_CASE("checkpoint_dir: saving the same step twice replaces it", "[checkpoint_dir]") {
    TempDir tmp;
    CheckpointDir dir(tmp.path(), 3);
    dir.save(7,
             [](const fs::path& s) { write_file_atomic(s / "a.txt", std::string_view("first")); });
    dir.save(7,
             [](const fs::path& s) { write_file_atomic(s / "b.txt", std::string_view("second")); });
    CHECK(dir_names(tmp.path()) == std::vector<std::string>{"step_00000007"});
    CHECK(dir_names(tmp.path() / "step_00000007") == std::vector<std::string>{"b.txt"});
    CHECK(slurp(tmp.path() / "step_00000007" / "b.txt") == "second");
    CHECK(dir.list().size() == 1);
}

TEST_CASE("checkpoint_dir: staging leftovers and junk names are ignored", "[checkpoint_dir]") {
    TempDir tmp;
    const fs::path& root = tmp.path();
    CheckpointDir dir(root, 5);
    dir.save(3, writer("three"));

    // Left behind by a crash, or put there by someone else, after the object was made.
    fs::create_directory(root / ".staging-step_00000009");
    put(root / ".staging-step_00000009" / "state.txt", "torn");
    fs::create_directory(root / "step_9");
    fs::create_directory(root / "step_000000010");
    fs::create_directory(root / "step_0000001x");
    fs::create_directory(root / "other");
    put(root / "step_00000011", "a file, not a directory");
    CHECK(*dir.latest() == root / "step_00000003");
    CHECK(dir.list().size() == 1);

    // A new CheckpointDir removes our own leftovers only; foreign names stay.
    CheckpointDir again(root, 5);
    CHECK(dir_names(root) == std::vector<std::string>{"other", "step_000000010", "step_00000003",
                                                      "step_00000011", "step_0000001x", "step_9"});
    CHECK(*again.latest() == root / "step_00000003");

    // A save of the step a stale staging dir belonged to starts from an empty staging dir.
    fs::create_directory(root / ".staging-step_00000004");
    put(root / ".staging-step_00000004" / "stale.txt", "stale");
    again.save(4, writer("four"));
    CHECK(dir_names(root / "step_00000004") == std::vector<std::string>{"shards", "state.txt"});
    CHECK(*again.latest() == root / "step_00000004");
}

TEST_CASE("checkpoint_dir: recovers from a replacement cut short", "[checkpoint_dir]") {
    TempDir tmp;
    const fs::path& root = tmp.path();
    {
        CheckpointDir dir(root, 5);
        dir.save(5, writer("five"));
        dir.save(6, writer("six"));
    }

    SECTION("crash between renaming the old one aside and the new one in") {
        fs::rename(root / "step_00000006", root / ".old-step_00000006");
        fs::create_directory(root / ".staging-step_00000006");
        CheckpointDir dir(root, 5);
        CHECK(dir_names(root) == std::vector<std::string>{"step_00000005", "step_00000006"});
        CHECK(slurp(root / "step_00000006" / "state.txt") == "six");
        CHECK(*dir.latest() == root / "step_00000006");
    }
    SECTION("crash while removing the replaced copy or a pruned one") {
        fs::create_directory(root / ".old-step_00000006");
        put(root / ".old-step_00000006" / "state.txt", "stale six");
        fs::create_directory(root / ".trash-step_00000002");
        CheckpointDir dir(root, 5);
        CHECK(dir_names(root) == std::vector<std::string>{"step_00000005", "step_00000006"});
        CHECK(slurp(root / "step_00000006" / "state.txt") == "six");
    }
}

TEST_CASE("checkpoint_dir: an unusable root throws starling::Error", "[checkpoint_dir]") {
    TempDir tmp;
    put(tmp.path() / "file", "x");
    CheckpointDir dir(tmp.path() / "file" / "ckpt", 2);  // root below a regular file
    CHECK_FALSE(dir.latest().has_value());
    try {
        dir.save(1, writer("one"));
        FAIL("no exception");
    } catch (const Error& e) {
        CHECK(std::string(e.what()).find((tmp.path() / "file" / "ckpt").string()) !=
              std::string::npos);
    }
}
