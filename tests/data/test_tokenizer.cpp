#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "data/tokenizer.h"
#include "test_util.h"

using Catch::Matchers::Contains;
using namespace starling::test;

TEST_CASE("byte tokenizer round trips all 256 byte values", "[data][tokenizer]") {
    std::string text;
    for (int i = 0; i < 256; ++i) text.push_back(static_cast<char>(i));
    text += "Hello, \xc3\xa9t\xc3\xa9!";  // multi-byte UTF-8 stays byte by byte

    const starling::ByteTokenizer tok;
    CHECK(tok.vocab_size() == 256);
    const std::vector<uint16_t> tokens = tok.encode(text);
    REQUIRE(tokens.size() == text.size());
    for (int i = 0; i < 256; ++i) {
        INFO("byte " << i);
        REQUIRE(tokens[size_t(i)] == i);
    }
    CHECK(tokens[256] == 'H');
    CHECK(tokens[263] == 0xc3);
    CHECK(tok.decode(tokens) == text);
    CHECK(tok.encode("").empty());
    CHECK(tok.decode(std::vector<uint16_t>{}).empty());
}

TEST_CASE("byte tokenizer rejects tokens outside the vocabulary", "[data][tokenizer]") {
    const starling::ByteTokenizer tok;
    CHECK_THAT(error_message([&] {
                   tok.decode(std::vector<uint16_t>{72, 105, 256});
               }),
               Contains("token 256 at position 2") && Contains("vocabulary of 256"));
    CHECK_THAT(error_message([&] { tok.decode(std::vector<uint16_t>{65535}); }),
               Contains("token 65535"));
}
