// train_bpe against merge orders worked out by hand, against a trainer that recounts every pair
// after every merge, and on the whole KJV (decode inverts encode, GPT-2's byte ids).
#include <catch2/catch.hpp>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "data/bpe_tokenizer.h"
#include "data/bpe_trainer.h"
#include "data/corpus.h"
#include "data/pretokenize.h"
#include "test_util.h"

using Catch::Matchers::Contains;
using namespace starling::test;
using starling::BpeTokenizer;
using starling::train_bpe;
using starling::TrainedBpe;
using Tokens = std::vector<uint16_t>;

namespace {

const char* const kTiny = "ab ab abc b";

// Merges as the byte strings merged, which do not depend on ids.
using ByteMerges = std::vector<std::pair<std::string, std::string>>;

ByteMerges byte_merges(const TrainedBpe& trained) {
    ByteMerges out;
    for (const auto& [a, b] : trained.merges)
        out.emplace_back(trained.token_bytes[size_t(a)], trained.token_bytes[size_t(b)]);
    return out;
}

// The plain algorithm: recount every pair of every word after every merge, take the most
// frequent, the smallest (first, second) byte strings among equals.
ByteMerges recounting_trainer(const std::string& text, size_t merges) {
    std::map<std::string, int64_t> counts;
    starling::Gpt2PreTokenizer().for_each_word(
        text, [&](std::string_view w) { counts[std::string(w)]++; });
    std::vector<std::pair<std::vector<std::string>, int64_t>> words;
    for (const auto& [w, n] : counts) {
        std::vector<std::string> symbols;
        for (char c : w) symbols.emplace_back(1, c);
        words.emplace_back(symbols, n);
    }
    ByteMerges out;
    while (out.size() < merges) {
        // Ordered: ties go to the first.
        std::map<std::pair<std::string, std::string>, int64_t> pairs;
        for (const auto& [symbols, n] : words)
            for (size_t i = 0; i + 1 < symbols.size(); i++)
                pairs[{symbols[i], symbols[i + 1]}] += n;
        if (pairs.empty()) break;
        auto best = pairs.begin();
        for (auto it = pairs.begin(); it != pairs.end(); ++it)
            if (it->second > best->second) best = it;
        const auto [a, b] = best->first;
        out.emplace_back(a, b);
        for (auto& [symbols, n] : words) {
            std::vector<std::string> next;
            for (size_t i = 0; i < symbols.size(); i++) {
                if (i + 1 < symbols.size() && symbols[i] == a && symbols[i + 1] == b) {
                    next.push_back(a + b);
                    i++;
                } else {
                    next.push_back(symbols[i]);
                }
            }
            symbols = std::move(next);
        }
    }
    return out;
}

const std::string& kjv() {
    static const std::string text = starling::read_kjv_text();
    return text;
}

}  // namespace

TEST_CASE("the trainer merges a tiny corpus in the order worked out by hand", "[data][bpe]") {
    // Words "ab", " ab", " abc", " b". Pair counts: a b 3, Ġ a 2, b c 1, Ġ b 1 -> merge a b.
    // Then Ġ ab 2, ab c 1, Ġ b 1 -> Ġ ab. Then Ġab c 1 and Ġ b 1 tie: " " < " ab" -> Ġ b. Then Ġab
    // c.
    const TrainedBpe trained = train_bpe(kTiny, 261);
    CHECK(byte_merges(trained) == ByteMerges{{"a", "b"}, {" ", "ab"}, {" ", "b"}, {" ab", "c"}});
    REQUIRE(trained.token_bytes.size() == 261);
    CHECK(trained.token_bytes[256] == "ab");
    CHECK(trained.token_bytes[259] == " abc");
    CHECK(trained.token_bytes[260] == "<|endoftext|>");

    const nlohmann::json json = nlohmann::json::parse(trained.hf_json);
    CHECK(json["model"]["type"] == "BPE");
    CHECK(json["model"]["merges"] == nlohmann::json{"a b", "\xc4\xa0 ab", "\xc4\xa0 b",
                                                    "\xc4\xa0"
                                                    "ab c"});
    CHECK(json["model"]["vocab"].size() == 261);
    CHECK(json["model"]["vocab"]["!"] == 0);
    CHECK(json["model"]["vocab"]["\xc4\xa0"] == 220);  // space
    CHECK(json["model"]["vocab"]["\xc4\x8a"] == 198);  // newline
    CHECK(json["model"]["vocab"]["\xc4\xa0"
                                 "abc"] == 259);
    CHECK(json["model"]["vocab"]["<|endoftext|>"] == 260);
    CHECK(json["added_tokens"] == nlohmann::json::parse(R"([{"id": 260, "content": "<|endoftext|>",
        "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true}])"));
    for (const char* part : {"pre_tokenizer", "decoder"}) {
        CHECK(json[part]["type"] == "ByteLevel");
        CHECK(json[part]["add_prefix_space"] == false);
    }
    CHECK(json["normalizer"].is_null());

    // Reloaded, it encodes the corpus into its four words' tokens.
    const BpeTokenizer reloaded = BpeTokenizer::parse(trained.hf_json, "trained.json");
    CHECK(reloaded.vocab_size() == 261);
    CHECK(reloaded.encode(kTiny) == Tokens{256, 257, 259, 258});
    CHECK(reloaded.encode("ba<|endoftext|>") == Tokens{65, 64, 260});
}

TEST_CASE("the trainer stops at the vocabulary size or when no pair is left", "[data][bpe]") {
    CHECK(byte_merges(train_bpe(kTiny, 259)) == ByteMerges{{"a", "b"}, {" ", "ab"}});
    const TrainedBpe all = train_bpe(kTiny, 1000);
    CHECK(all.merges.size() == 4);
    CHECK(all.token_bytes.size() == 261);
    CHECK(train_bpe("", 300).merges.empty());
    CHECK_THAT(error_message([] { train_bpe(kTiny, 256); }),
               Contains("vocab size 256 is outside [257, 65536]"));
    CHECK_THAT(error_message([] { train_bpe(kTiny, 65537); }), Contains("65537"));
}

TEST_CASE("the trainer's pair counts, updated per merge, agree with a full recount",
          "[data][bpe]") {
    const std::string text = kjv().substr(0, 60000);
    const TrainedBpe trained = train_bpe(text, 256 + 300 + 1);
    CHECK(byte_merges(trained) == recounting_trainer(text, 300));
}

TEST_CASE("a tokenizer trained on the KJV round trips it and random bytes", "[data][bpe]") {
    const TrainedBpe trained = train_bpe(kjv(), 4096);
    const BpeTokenizer tokenizer = BpeTokenizer::parse(trained.hf_json, "kjv.json");
    const Tokens tokens = tokenizer.encode(kjv());
    CHECK(tokenizer.vocab_size() == 4096);
    CHECK(tokenizer.decode(tokens) == kjv());
    CHECK(tokens.size() <
          kjv().size() / 3);  // a byte-level BPE of this size: about 4 bytes a token
    // GPT-2's ids for single characters: the byte tokens are in its order.
    CHECK(tokenizer.encode("!") == Tokens{0});
    CHECK(tokenizer.encode("H") == Tokens{39});
    CHECK(tokenizer.encode("\n") == Tokens{198});
    CHECK(tokenizer.encode("<|endoftext|>") == Tokens{4095});

    std::string bytes;
    for (uint16_t d : pseudo_random_tokens(100000, 3)) bytes.push_back(char(d & 0xff));
    CHECK(tokenizer.decode(tokenizer.encode(bytes)) == bytes);
}
