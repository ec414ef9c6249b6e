// Sha256 against the FIPS 180-2 test vectors, and pieces against their bytes laid out by hand.
#include "common/sha256.h"

#include <catch2/catch.hpp>
#include <cstdio>
#include <span>
#include <string>
#include <string_view>

using namespace starling;

namespace {

std::string hex(const Sha256Digest& digest) {
    std::string text;
    char pair[3];
    for (const unsigned char byte : digest) {
        std::snprintf(pair, sizeof pair, "%02x", byte);
        text += pair;
    }
    return text;
}

std::span<const std::byte> bytes_of(std::string_view text) {
    return std::as_bytes(std::span(text));
}

}  // namespace

TEST_CASE("Sha256 gives the FIPS 180-2 digests, whole or added in pieces") {
    Sha256 abc;
    abc.add(bytes_of("abc"));
    CHECK(hex(abc.finish()) == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    Sha256 split;
    split.add(bytes_of("abcdbcdecdefdefgefghfghighijhijkijkljklm"));
    split.add(bytes_of("klmnlmnomnopnopq"));
    CHECK(hex(split.finish()) ==
          "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
    Sha256 empty;
    CHECK(hex(empty.finish()) ==
          "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
}

TEST_CASE("Sha256 pieces are their length, little-endian, then their bytes") {
    Sha256 pieces;
    pieces.add_piece(bytes_of("ab"));
    pieces.add_u64(0x0102030405060708);
    const Sha256Digest digest = pieces.finish();
    const std::string by_hand =
        std::string("\x02\0\0\0\0\0\0\0ab", 10) + "\x08\x07\x06\x05\x04\x03\x02\x01";
    Sha256 whole;
    whole.add(bytes_of(by_hand));
    CHECK(digest == whole.finish());
    // A byte moved from one piece to the next makes another digest.
    Sha256 moved;
    moved.add_piece(bytes_of("a"));
    moved.add_piece(bytes_of("b"));
    Sha256 together;
    together.add_piece(bytes_of("ab"));
    CHECK(moved.finish() != together.finish());
    // The seed is the first 8 bytes, little-endian.
    Sha256Digest seeded{};
    seeded[0] = 0x11;
    seeded[7] = 0x88;
    seeded[8] = 0xff;
    CHECK(digest_seed(seeded) == 0x8800000000000011);
}
