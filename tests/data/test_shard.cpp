#include <catch2/catch.hpp>
#include <filesystem>
#include <string>
#include <vector>

#include "data/shard.h"
#include "test_util.h"

using Catch::Matchers::Contains;
using namespace starling::test;
namespace fs = std::filesystem;

TEST_CASE("shard round trip: tokens and exact header bytes", "[data][shard]") {
    TempDir dir;
    const std::string path = dir.file("train_000000.bin");
    std::vector<uint16_t> tokens = {0, 1, 255, 256, 32767, 32768, 65535, 12345};
    const std::vector<uint16_t> more = pseudo_random_tokens(1000, 1);
    tokens.insert(tokens.end(), more.begin(), more.end());

    starling::write_shard(path, tokens);
    CHECK(dir_names(dir.path()) == std::vector<std::string>{"train_000000.bin"});  // no temp file

    const std::string bytes = slurp(path);
    const std::vector<unsigned char> raw(bytes.begin(), bytes.end());
    REQUIRE(raw.size() == 1024 + 2 * tokens.size());
    // 20240520 = 0x0134D888, little-endian.
    CHECK(raw[0] == 0x88);
    CHECK(raw[1] == 0xd8);
    CHECK(raw[2] == 0x34);
    CHECK(raw[3] == 0x01);
    CHECK(raw[4] == 1);
    CHECK(raw[5] == 0);
    CHECK(raw[6] == 0);
    CHECK(raw[7] == 0);
    const size_t n = tokens.size();  // 1008 = 0x3F0
    CHECK(raw[8] == (n & 0xff));
    CHECK(raw[9] == ((n >> 8) & 0xff));
    CHECK(raw[10] == 0);
    CHECK(raw[11] == 0);
    for (size_t i = 12; i < 1024; ++i) {
        INFO("header byte " << i);
        REQUIRE(raw[i] == 0);
    }
    CHECK(bytes == raw_shard(20240520, 1, int32_t(n), tokens));

    starling::Shard shard(path);
    CHECK(shard.path() == path);
    REQUIRE(shard.size() == tokens.size());
    CHECK(std::vector<uint16_t>(shard.tokens().begin(), shard.tokens().end()) == tokens);
    CHECK(shard[6] == 65535);

    // Moving keeps the mapping valid.
    starling::Shard moved(std::move(shard));
    CHECK(moved.size() == tokens.size());
    CHECK(moved[3] == 256);
}

TEST_CASE("write_shard replaces an existing shard", "[data][shard]") {
    TempDir dir;
    const std::string path = dir.file("val_000000.bin");
    starling::write_shard(path, std::vector<uint16_t>{1, 2, 3, 4, 5});
    starling::write_shard(path, std::vector<uint16_t>{9, 8});
    starling::Shard shard(path);
    CHECK(std::vector<uint16_t>(shard.tokens().begin(), shard.tokens().end()) ==
          std::vector<uint16_t>{9, 8});
    CHECK(dir_names(dir.path()) == std::vector<std::string>{"val_000000.bin"});  // no temp file
}

TEST_CASE("write_shard rejects an empty shard and a missing directory", "[data][shard]") {
    TempDir dir;
    const std::string path = dir.file("train_000000.bin");
    CHECK_THAT(error_message([&] { starling::write_shard(path, std::vector<uint16_t>{}); }),
               Contains(path) && Contains("empty"));
    CHECK_FALSE(fs::exists(path));

    const std::string nowhere = dir.file("no/such/dir/train_000000.bin");
    CHECK_THAT(error_message([&] { starling::write_shard(nowhere, std::vector<uint16_t>{1}); }),
               Contains(nowhere) && Contains("No such file"));
    CHECK(dir_names(dir.path()).empty());
}

TEST_CASE("Shard rejects bad files, naming the path and the problem", "[data][shard]") {
    TempDir dir;
    const std::vector<uint16_t> tokens = {10, 20, 30, 40, 50};
    auto message_for = [&](const std::string& name, const std::string& bytes) {
        const std::string path = dir.file(name);
        put(path, bytes);
        return error_message([&] { starling::Shard shard(path); });
    };

    SECTION("missing file") {
        const std::string path = dir.file("absent.bin");
        CHECK_THAT(error_message([&] { starling::Shard shard(path); }),
                   Contains(path) && Contains("no such file"));
    }
    SECTION("a directory") {
        const std::string path = dir.file("subdir.bin");
        fs::create_directory(path);
        CHECK_THAT(error_message([&] { starling::Shard shard(path); }),
                   Contains(path) && Contains("not a regular file"));
    }
    SECTION("shorter than the header") {
        std::string bytes = raw_shard(20240520, 1, 5, tokens);
        bytes.resize(1000);
        CHECK_THAT(message_for("short.bin", bytes), Contains(dir.file("short.bin")) &&
                                                        Contains("too short") &&
                                                        Contains("1000 bytes"));
        CHECK_THAT(message_for("empty.bin", {}),
                   Contains(dir.file("empty.bin")) && Contains("too short"));
    }
    SECTION("wrong magic: says what was found and what was expected") {
        CHECK_THAT(message_for("magic.bin", raw_shard(20240519, 1, 5, tokens)),
                   Contains(dir.file("magic.bin")) && Contains("magic") && Contains("20240519") &&
                       Contains("20240520"));
    }
    SECTION("unsupported version") {
        CHECK_THAT(message_for("version.bin", raw_shard(20240520, 2, 5, tokens)),
                   Contains(dir.file("version.bin")) && Contains("version 2"));
    }
    SECTION("truncated payload") {
        std::string bytes = raw_shard(20240520, 1, 1000, tokens);
        CHECK_THAT(message_for("truncated.bin", bytes),
                   Contains(dir.file("truncated.bin")) &&
                       Contains("truncated: header says 1000 tokens but the file holds 5"));
        bytes.pop_back();  // an odd byte count
        CHECK_THAT(message_for("odd.bin", bytes),
                   Contains(dir.file("odd.bin")) && Contains("truncated"));
    }
    SECTION("trailing bytes") {
        CHECK_THAT(message_for("trailing.bin", raw_shard(20240520, 1, 4, tokens)),
                   Contains(dir.file("trailing.bin")) && Contains("trailing bytes") &&
                       Contains("2 extra"));
    }
    SECTION("zero or negative token count") {
        CHECK_THAT(message_for("zero.bin", raw_shard(20240520, 1, 0, {})),
                   Contains(dir.file("zero.bin")) && Contains("0 tokens"));
        CHECK_THAT(message_for("negative.bin", raw_shard(20240520, 1, -3, {})),
                   Contains(dir.file("negative.bin")) && Contains("negative"));
    }
}

TEST_CASE("list_shards finds <split>_*.bin sorted and explains an empty result", "[data][shard]") {
    TempDir dir;
    starling::write_shard(dir.file("train_000001.bin"), std::vector<uint16_t>{1, 2});
    starling::write_shard(dir.file("train_000000.bin"), std::vector<uint16_t>{3, 4});
    starling::write_shard(dir.file("train_000010.bin"), std::vector<uint16_t>{5, 6});
    starling::write_shard(dir.file("val_000000.bin"), std::vector<uint16_t>{7, 8});
    put(dir.file("train_000002.bin.tmp"), "\x01\x02\x03");
    put(dir.file(".train_000003.bin.tmp-42-0"), "\x01\x02\x03");  // an AtomicFileWriter leftover
    put(dir.file("train_notes.txt"), "\x01");
    put(dir.file("mytrain_000000.bin"), "\x01");
    fs::create_directory(dir.file("train_dir.bin"));

    CHECK(starling::list_shards(dir.path().string(), "train") ==
          std::vector<std::string>{dir.file("train_000000.bin"), dir.file("train_000001.bin"),
                                   dir.file("train_000010.bin")});
    CHECK(starling::list_shards(dir.path().string(), "val") ==
          std::vector<std::string>{dir.file("val_000000.bin")});

    TempDir empty;
    CHECK_THAT(error_message([&] { starling::list_shards(empty.path().string(), "train"); }),
               Contains("no train shards in " + empty.path().string()) &&
                   Contains("starling data prepare"));
    CHECK_THAT(error_message([&] { starling::list_shards(dir.path().string(), "test"); }),
               Contains("no test shards in " + dir.path().string()));

    const std::string missing = dir.file("missing");
    CHECK_THAT(error_message([&] { starling::list_shards(missing, "train"); }),
               Contains(missing) && Contains("does not exist"));
    CHECK_THAT(error_message([&] { starling::list_shards(dir.file("val_000000.bin"), "train"); }),
               Contains(dir.file("val_000000.bin")) && Contains("not a directory"));
}

TEST_CASE("shard_file_name pads the index to six digits", "[data][shard]") {
    CHECK(starling::shard_file_name("train", 0) == "train_000000.bin");
    CHECK(starling::shard_file_name("val", 123) == "val_000123.bin");
    CHECK(starling::shard_file_name("train", 1234567) == "train_1234567.bin");
}
