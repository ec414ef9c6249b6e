#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "data/bpe_tokenizer.h"
#include "data/prepare.h"
#include "data/shard.h"
#include "test_util.h"

using Catch::Matchers::Contains;
using namespace starling::test;

namespace {

std::vector<uint16_t> read_tokens(const std::string& path) {
    starling::Shard shard(path);
    return {shard.tokens().begin(), shard.tokens().end()};
}

// Bytes of text as token values, computed here rather than through the tokenizer.
std::vector<uint16_t> bytes_of(const std::string& text, size_t begin, size_t end) {
    std::vector<uint16_t> out;
    for (size_t i = begin; i < end; ++i) out.push_back(static_cast<unsigned char>(text[i]));
    return out;
}

std::string sample_text(size_t n) {
    std::string text;
    for (size_t i = 0; i < n; ++i) text.push_back(static_cast<char>((i * 37 + i / 7) % 256));
    return text;
}

}  // namespace

TEST_CASE("prepare_shards splits train and val and writes shards", "[data][prepare]") {
    TempDir tmp;
    const std::string out = tmp.file("nested/out");  // created by prepare_shards
    const std::string text = sample_text(1000);

    starling::PrepareOptions options;
    options.out_dir = out;
    options.val_fraction = 0.1;
    options.shard_tokens = 300;
    const starling::PrepareResult result = starling::prepare_shards(text, options);

    CHECK(result.total_tokens == 1000);
    CHECK(result.val_tokens == 100);
    CHECK(result.train_tokens == 900);
    CHECK(result.removed_stale == 0);
    REQUIRE(result.train_paths == std::vector<std::string>{out + "/train_000000.bin",
                                                           out + "/train_000001.bin",
                                                           out + "/train_000002.bin"});
    REQUIRE(result.val_paths == std::vector<std::string>{out + "/val_000000.bin"});
    CHECK(starling::list_shards(out, "train") == result.train_paths);
    CHECK(starling::list_shards(out, "val") == result.val_paths);

    CHECK(read_tokens(result.train_paths[0]) == bytes_of(text, 0, 300));
    CHECK(read_tokens(result.train_paths[1]) == bytes_of(text, 300, 600));
    CHECK(read_tokens(result.train_paths[2]) == bytes_of(text, 600, 900));
    CHECK(read_tokens(result.val_paths[0]) == bytes_of(text, 900, 1000));  // the tail
}

TEST_CASE("prepare_shards: uneven sizes, balanced shards, counts add up", "[data][prepare]") {
    TempDir tmp;
    const std::string text = sample_text(1003);
    starling::PrepareOptions options;
    options.out_dir = tmp.path().string();
    options.val_fraction = 0.05;  // 50.15 -> 50 validation tokens
    options.shard_tokens = 100;
    const starling::PrepareResult result = starling::prepare_shards(text, options);

    CHECK(result.val_tokens == 50);
    CHECK(result.train_tokens == 953);
    CHECK(result.train_tokens + result.val_tokens == text.size());
    REQUIRE(result.train_paths.size() == 10);  // ceil(953 / 100)
    REQUIRE(result.val_paths.size() == 1);

    std::vector<uint16_t> train;
    size_t smallest = 1000, largest = 0;
    for (const std::string& path : result.train_paths) {
        const std::vector<uint16_t> tokens = read_tokens(path);
        CHECK(tokens.size() <= 100);
        smallest = std::min(smallest, tokens.size());
        largest = std::max(largest, tokens.size());
        train.insert(train.end(), tokens.begin(), tokens.end());
    }
    CHECK(largest - smallest <= 1);
    CHECK(train == bytes_of(text, 0, 953));
    CHECK(read_tokens(result.val_paths[0]) == bytes_of(text, 953, 1003));

    SECTION("a second run with fewer shards removes the stale ones") {
        options.shard_tokens = 2000;
        const starling::PrepareResult again = starling::prepare_shards(text, options);
        CHECK(again.train_paths == std::vector<std::string>{tmp.file("train_000000.bin")});
        CHECK(again.removed_stale == 9);
        CHECK(starling::list_shards(tmp.path().string(), "train") == again.train_paths);
        CHECK(read_tokens(again.train_paths[0]) == bytes_of(text, 0, 953));
    }
    SECTION("validation is split by shard_tokens too") {
        options.shard_tokens = 30;
        const starling::PrepareResult small = starling::prepare_shards(text, options);
        CHECK(small.val_paths.size() == 2);  // 50 tokens -> 25 + 25
        CHECK(read_tokens(small.val_paths[0]) == bytes_of(text, 953, 978));
        CHECK(read_tokens(small.val_paths[1]) == bytes_of(text, 978, 1003));
        CHECK(small.train_paths.size() == 32);  // ceil(953 / 30)
    }
}

TEST_CASE("prepare_shards rejects bad options and too little text", "[data][prepare]") {
    TempDir tmp;
    const std::string text = sample_text(1000);
    starling::PrepareOptions options;
    options.out_dir = tmp.path().string();

    for (double bad : {0.0, -0.1, 0.51, 1.0, std::nan("")}) {
        options.val_fraction = bad;
        INFO("val_fraction " << bad);
        CHECK_THAT(error_message([&] { starling::prepare_shards(text, options); }),
                   Contains("val_fraction") && Contains("outside (0, 0.5]"));
    }
    options.val_fraction = 0.5;  // the upper bound is allowed
    CHECK(starling::prepare_shards(text, options).val_tokens == 500);

    options.val_fraction = 0.05;
    CHECK_THAT(error_message([&] { starling::prepare_shards("In the beginning", options); }),
               Contains("too short") && Contains("16 tokens"));
    CHECK_THAT(error_message([&] { starling::prepare_shards("", options); }),
               Contains("too short"));

    options.shard_tokens = 0;
    CHECK_THAT(error_message([&] { starling::prepare_shards(text, options); }),
               Contains("shard_tokens"));

    options.shard_tokens = 100;
    options.out_dir = "";
    CHECK_THAT(error_message([&] { starling::prepare_shards(text, options); }),
               Contains("output directory"));

    options.out_dir = tmp.file("a_file");
    put(options.out_dir, "\x01\x02\x03");
    CHECK_THAT(error_message([&] { starling::prepare_shards(text, options); }),
               Contains(options.out_dir));
}

TEST_CASE("prepare_shards with a tokenizer writes its tokens and copies its file",
          "[data][prepare][bpe]") {
    TempDir tmp;
    const std::string fixture =
        std::string(STARLING_SOURCE_DIR) + "/tests/data/gpt2_style_tokenizer.json";
    std::string text;
    for (int i = 0; i < 20; i++) text += "In the beginning God created the heaven and the earth.\n";
    starling::PrepareOptions options;
    options.out_dir = tmp.path().string();
    options.tokenizer = fixture;
    options.val_fraction = 0.1;
    const starling::PrepareResult result = starling::prepare_shards(text, options);
    CHECK(result.vocab_size == 50257);

    // Genesis 1:1 is 31 tokens with the fixture (test_bpe_tokenizer.cpp), the newline one more.
    CHECK(result.total_tokens == 20 * 32);
    std::vector<uint16_t> tokens = read_tokens(result.train_paths[0]);
    const std::vector<uint16_t> val = read_tokens(result.val_paths[0]);
    tokens.insert(tokens.end(), val.begin(), val.end());
    CHECK(tokens.size() == result.total_tokens);
    CHECK(std::vector<uint16_t>(tokens.begin(), tokens.begin() + 2) ==
          std::vector<uint16_t>{259, 258});  // In, " the"
    CHECK(starling::BpeTokenizer::read(fixture).decode(tokens) == text);
    CHECK(slurp(tmp.file("tokenizer.json")) == slurp(fixture));
    CHECK_NOTHROW(starling::check_shards_tokenizer(options.out_dir, fixture));
    CHECK_THAT(error_message([&] { starling::check_shards_tokenizer(options.out_dir, ""); }),
               Contains("prepared with " + tmp.file("tokenizer.json").string()) &&
                   Contains("[data].tokenizer is empty"));
    const std::string other = tmp.file("other.json").string();
    put(other, slurp(fixture) + " ");
    CHECK_THAT(error_message([&] { starling::check_shards_tokenizer(options.out_dir, other); }),
               Contains("another tokenizer") && Contains(other));

    // Bytes again: the directory no longer claims the BPE vocabulary.
    options.tokenizer.clear();
    CHECK(starling::prepare_shards(text, options).vocab_size == 256);
    CHECK_FALSE(std::filesystem::exists(tmp.file("tokenizer.json")));
    CHECK_NOTHROW(starling::check_shards_tokenizer(options.out_dir, ""));
    CHECK_THAT(
        error_message([&] { starling::check_shards_tokenizer(options.out_dir, fixture); }),
        Contains("no tokenizer.json") && Contains("starling data prepare --tokenizer " + fixture));

    options.tokenizer = tmp.file("missing.json").string();
    CHECK_THAT(error_message([&] { starling::prepare_shards(text, options); }),
               Contains("missing.json"));
}
