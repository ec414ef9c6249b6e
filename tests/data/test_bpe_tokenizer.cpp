// BpeTokenizer and GPT-2's pre-tokenizer against encodings worked out by hand.
//
// gpt2_style_tokenizer.json: GPT-2's 256 byte tokens in GPT-2's order (written out by a few lines
// of Python from GPT-2's bytes_to_unicode, not by this code), 14 merges by hand, and
// <|endoftext|> at GPT-2's id 50256. Merge ranks and results:
//   0 Ġ t -> Ġt 256   1 h e -> he 257    2 Ġt he -> Ġthe 258   3 I n -> In 259    4 a n -> an 260
//   5 Ġ an -> Ġan 261 6 Ġan d -> Ġand 262 7 e a -> ea 263     8 r t -> rt 264    9 Ġ G -> ĠG 265
//   10 o d -> od 266  11 ĠG od -> ĠGod 267 12 i n -> in 268   13 in g -> ing 269
// Byte tokens are GPT-2's: a printable ASCII byte b is b - 33 ("a" 64, "." 13), space "Ġ" is 220.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "data/bpe_tokenizer.h"
#include "data/pretokenize.h"
#include "test_util.h"

using Catch::Matchers::Contains;
using namespace starling::test;
using starling::BpeTokenizer;
using Tokens = std::vector<uint16_t>;

namespace {

const std::string kFixture =
    std::string(STARLING_SOURCE_DIR) + "/tests/data/gpt2_style_tokenizer.json";

const BpeTokenizer& fixture() {
    static const BpeTokenizer tokenizer = BpeTokenizer::read(kFixture);
    return tokenizer;
}

std::vector<std::string> split(const std::string& text) {
    return starling::Gpt2PreTokenizer().split(text);
}

// Byte tokens of a printable ASCII string, in GPT-2's order.
Tokens ascii_tokens(const std::string& text) {
    Tokens out;
    for (char c : text) out.push_back(uint16_t(c - 33));
    return out;
}

Tokens concat(std::initializer_list<Tokens> parts) {
    Tokens out;
    for (const Tokens& p : parts) out.insert(out.end(), p.begin(), p.end());
    return out;
}

nlohmann::json fixture_json() { return nlohmann::json::parse(slurp(kFixture)); }

// The message of the Error that parsing json throws.
std::string load_error(const nlohmann::json& json) {
    return error_message([&] { BpeTokenizer::parse(json.dump(), "bad.json"); });
}

}  // namespace

TEST_CASE("GPT-2's pre-tokenizer splits as its expression does, checked by hand", "[data][bpe]") {
    // \s+(?!\S) leaves the last space of a run to the next word; a run before the end stays whole.
    CHECK(split("a  b\n\nc") == std::vector<std::string>{"a", " ", " b", "\n", "\n", "c"});
    CHECK(split("x\n y") == std::vector<std::string>{"x", "\n", " y"});
    CHECK(split("Amen.  ") == std::vector<std::string>{"Amen", ".", "  "});
    // Contractions, lower case only: "'LL" is punctuation then letters.
    CHECK(split("the LORD's word") == std::vector<std::string>{"the", " LORD", "'s", " word"});
    CHECK(split("they're") == std::vector<std::string>{"they", "'re"});
    CHECK(split("I'LL") == std::vector<std::string>{"I", "'", "LL"});
    // Digits apart from letters and punctuation; a space joins the word after it.
    CHECK(split("John 3:16, and 42.") ==
          std::vector<std::string>{"John", " 3", ":", "16", ",", " and", " 42", "."});
    CHECK(split("(Selah.)--") == std::vector<std::string>{"(", "Selah", ".)--"});
    // Letters by Unicode property: é and ü are letters, so UTF-8 is read as UTF-8.
    CHECK(split("caf\xc3\xa9 \xc3\xbc"
                "ber") == std::vector<std::string>{"caf\xc3\xa9",
                                                   " \xc3\xbc"
                                                   "ber"});
    CHECK(split("").empty());
}

TEST_CASE("bytes that are not UTF-8 form words of their own and nothing is lost", "[data][bpe]") {
    CHECK(split("ab\xff\xfe"
                "cd") == std::vector<std::string>{"ab", "\xff\xfe", "cd"});
    CHECK(split("\xc3") == std::vector<std::string>{"\xc3"});  // a truncated sequence
    CHECK(split("a \xff"
                "b") == std::vector<std::string>{"a", " ", "\xff", "b"});
}

TEST_CASE("Genesis 1:1 and 1:3 encode as worked out by hand", "[data][bpe]") {
    const BpeTokenizer& t = fixture();
    CHECK(t.vocab_size() == 50257);
    CHECK(t.merge_count() == 14);
    // Words: "In" " the" " beginning" " God" " created" " the" " heaven" " and" " the" " earth" "."
    //   In:         I n -> In (3)
    //   " the":     Ġ t h e -> Ġt (0) -> he (1) -> Ġthe (2)
    //   " beginning": i n (12) twice -> in g (13); Ġ b e g n stay
    //   " God":     Ġ G (9) -> o d (10) -> ĠG od (11)
    //   " created": e a (7); nothing else
    //   " heaven":  h e (1) before e a (7), which then no longer occurs
    //   " and":     a n (4) -> Ġ an (5) -> Ġan d (6)
    //   " earth":   e a (7) -> r t (8); Ġ and h stay
    const Tokens genesis_1_1 = concat({{259, 258},
                                       {220, 65, 68, 70, 268, 77, 269},
                                       {267},
                                       {220, 66, 81, 263, 83, 68, 67},
                                       {258},
                                       {220, 257, 64, 85, 68, 77},
                                       {262, 258},
                                       {220, 263, 264, 71},
                                       {13}});
    const std::string verse = "In the beginning God created the heaven and the earth.";
    CHECK(t.encode(verse) == genesis_1_1);
    CHECK(t.decode(genesis_1_1) == verse);

    // "And": no merge of capital A with n. " said", " Let", " be", " light", " was": no merge
    // applies (Ġ t merges only before t). " there": Ġt (0), he (1), Ġthe (2), then r e stay.
    const std::string verse3 = "And God said, Let there be light: and there was light.";
    const Tokens there = {258, 81, 68};
    const Tokens light = concat({{220}, ascii_tokens("light")});
    const Tokens genesis_1_3 = concat({ascii_tokens("And"),
                                       {267},
                                       {220},
                                       ascii_tokens("said,"),
                                       {220},
                                       ascii_tokens("Let"),
                                       there,
                                       {220},
                                       ascii_tokens("be"),
                                       light,
                                       ascii_tokens(":"),
                                       {262},
                                       there,
                                       {220},
                                       ascii_tokens("was"),
                                       light,
                                       {13}});
    CHECK(t.encode(verse3) == genesis_1_3);
    CHECK(t.decode(genesis_1_3) == verse3);
}

TEST_CASE("byte tokens follow GPT-2's order", "[data][bpe]") {
    // GPT-2's own ids for these single characters.
    CHECK(fixture().encode("!") == Tokens{0});
    CHECK(fixture().encode("H") == Tokens{39});
    CHECK(fixture().encode("\n") == Tokens{198});
    CHECK(fixture().encode(" ") == Tokens{220});
    CHECK(fixture().encode(std::string(1, '\0')) == Tokens{188});
    CHECK(fixture().encode("\xff") ==
          Tokens{187});  // printable Latin-1: the 188 printables end with it
}

TEST_CASE("added tokens are matched verbatim before pre-tokenization", "[data][bpe]") {
    const BpeTokenizer& t = fixture();
    CHECK(t.encode("<|endoftext|>") == Tokens{50256});  // GPT-2's id
    CHECK(t.encode("In<|endoftext|> the") == Tokens{259, 50256, 258});
    CHECK(t.encode("<|endoftext|><|endoftext|>") == Tokens{50256, 50256});
    CHECK(t.decode(Tokens{50256, 259}) == "<|endoftext|>In");
    // One character short is ordinary text: "<|" "endoftext" "|", no merge applies inside.
    CHECK(t.encode("<|endoftext|") == ascii_tokens("<|endoftext|"));
    CHECK_THAT(error_message([&] {
                   t.decode(Tokens{259, 300});
               }),
               Contains(kFixture) && Contains("token 300 at position 1 is not in the vocabulary"));
}

TEST_CASE("merges read the same as \"a b\" strings and as [\"a\", \"b\"] pairs", "[data][bpe]") {
    nlohmann::json json = fixture_json();
    nlohmann::json pairs = nlohmann::json::array();
    for (const auto& merge : json["model"]["merges"]) {
        const std::string text = merge.get<std::string>();
        const size_t space = text.find(' ');
        pairs.push_back({text.substr(0, space), text.substr(space + 1)});
    }
    json["model"]["merges"] = pairs;
    const BpeTokenizer from_pairs = BpeTokenizer::parse(json.dump(), "pairs.json");
    const std::string verse = "In the beginning God created the heaven and the earth.";
    CHECK(from_pairs.encode(verse) == fixture().encode(verse));
    CHECK(from_pairs.merge_count() == 14);
}

TEST_CASE("every malformed tokenizer.json is an error naming the file and the problem",
          "[data][bpe]") {
    CHECK_THAT(error_message([] { BpeTokenizer::parse("{\"model\": ", "bad.json"); }),
               Contains("bad.json: not JSON"));
    CHECK_THAT(error_message([] { BpeTokenizer::read("/nonexistent/tokenizer.json"); }),
               Contains("/nonexistent/tokenizer.json"));
    CHECK_THAT(load_error(nlohmann::json::array()), Contains("bad.json: not a tokenizer.json"));

    auto with = [](auto change) {
        nlohmann::json json = fixture_json();
        change(json);
        return load_error(json);
    };
    CHECK_THAT(with([](auto& j) { j["model"]["type"] = "WordPiece"; }), Contains("only BPE"));
    CHECK_THAT(with([](auto& j) { j.erase("model"); }), Contains("the file has no \"model\""));
    CHECK_THAT(with([](auto& j) { j["model"].erase("type"); }), Contains("model has no \"type\""));
    CHECK_THAT(with([](auto& j) { j["model"].erase("vocab"); }),
               Contains("model has no \"vocab\""));
    CHECK_THAT(with([](auto& j) { j["model"].erase("merges"); }),
               Contains("model has no \"merges\""));
    CHECK_THAT(with([](auto& j) { j.erase("pre_tokenizer"); }),
               Contains("the file has no \"pre_tokenizer\""));
    CHECK_THAT(with([](auto& j) { j["model"]["merges"].push_back("\xc4\xa0 zz"); }),
               Contains("merge 14") && Contains("\"zz\" is not in model.vocab"));
    // Both parts known, their concatenation not.
    CHECK_THAT(with([](auto& j) { j["model"]["merges"].push_back("\xc4\xa0 h"); }),
               Contains("\"\xc4\xa0h\" is not in model.vocab"));
    CHECK_THAT(with([](auto& j) { j["model"]["merges"].push_back("Ġthe"); }),
               Contains("not two tokens separated by one space"));
    CHECK_THAT(with([](auto& j) { j["model"]["merges"].push_back(42); }), Contains("neither"));
    CHECK_THAT(with([](auto& j) { j["model"]["vocab"]["zz"] = 70000; }),
               Contains("token \"zz\" has id 70000, outside [0, 65535]"));
    CHECK_THAT(with([](auto& j) { j["model"]["vocab"]["zz"] = -1; }), Contains("has id -1"));
    CHECK_THAT(with([](auto& j) { j["model"]["vocab"]["zz"] = "7"; }), Contains("not an integer"));
    CHECK_THAT(with([](auto& j) { j["model"]["vocab"]["zz"] = 257; }),
               Contains("have the same id 257"));
    CHECK_THAT(with([](auto& j) { j["added_tokens"][0]["id"] = 259; }),
               Contains("have the same id 259"));
    CHECK_THAT(with([](auto& j) { j["model"]["vocab"].erase("\xc4\xa0"); }),
               Contains("lacks the token for byte 32"));
    CHECK_THAT(with([](auto& j) { j["model"]["vocab"]["\xe2\x82\xac"] = 300; }),
               Contains("outside GPT-2's byte-level alphabet"));
    CHECK_THAT(with([](auto& j) {
                   j["normalizer"] = {{"type", "NFC"}};
               }),
               Contains("normalizer NFC is not supported"));
    CHECK_THAT(with([](auto& j) {
                   j["pre_tokenizer"] = {{"type", "Whitespace"}};
               }),
               Contains("pre_tokenizer Whitespace is not supported"));
    CHECK_THAT(with([](auto& j) { j["pre_tokenizer"]["add_prefix_space"] = true; }),
               Contains("pre_tokenizer.add_prefix_space = true is not supported"));
    CHECK_THAT(with([](auto& j) { j["decoder"] = nullptr; }),
               Contains("decoder null is not supported"));
    CHECK_THAT(with([](auto& j) { j["model"]["dropout"] = 0.1; }),
               Contains("model.dropout = 0.1 is not supported"));
    CHECK_THAT(with([](auto& j) { j["model"]["continuing_subword_prefix"] = "##"; }),
               Contains("continuing_subword_prefix"));
    CHECK_THAT(with([](auto& j) { j["added_tokens"][0]["lstrip"] = true; }),
               Contains("added_tokens[0].lstrip = true is not supported"));
    CHECK_THAT(with([](auto& j) { j["added_tokens"][0]["content"] = ""; }),
               Contains("empty content"));
}

TEST_CASE("decode inverts encode on random bytes, UTF-8 or not", "[data][bpe]") {
    // Bytes drawn from an alphabet that makes every kind of word, contractions and added tokens.
    const std::vector<std::string> pieces = {"a",
                                             "e",
                                             "n",
                                             "d",
                                             "t",
                                             "h",
                                             "I",
                                             " ",
                                             "  ",
                                             "\n",
                                             "'s",
                                             "'re",
                                             "3",
                                             ":",
                                             ".",
                                             "\xc3\xa9",
                                             "\xff",
                                             "\xc3",
                                             "\x80",
                                             "\t",
                                             "<|endoftext|>",
                                             "<|",
                                             std::string(1, '\0')};
    const Tokens draws = pseudo_random_tokens(20000, 7);
    std::string text;
    for (uint16_t d : draws) text += pieces[d % pieces.size()];
    const Tokens encoded = fixture().encode(text);
    CHECK(fixture().decode(encoded) == text);
    CHECK(encoded.size() < text.size());

    std::string bytes;
    for (uint16_t d : pseudo_random_tokens(50000, 8)) bytes.push_back(char(d & 0xff));
    CHECK(fixture().decode(fixture().encode(bytes)) == bytes);
}
