// A round message's signature (peer/message_signature.h) against the layout written out here by
// hand and checked with libsodium's one-shot calls, and against every change a relay could make.
#include <openssl/sha.h>
#include <sodium.h>

#include <catch2/catch.hpp>
#include <cstddef>
#include <string>
#include <vector>

#include "peer/identity.h"
#include "peer/message_signature.h"

using namespace starling;

namespace {

using Bytes = std::vector<std::byte>;

Bytes bytes_of(const std::string& text) {
    Bytes out;
    for (char c : text) out.push_back(static_cast<std::byte>(c));
    return out;
}

void append_u64(std::vector<unsigned char>& out, uint64_t value) {
    for (int i = 0; i < 8; i++) out.push_back(static_cast<unsigned char>(value >> (8 * i)));
}

struct Message {
    uint64_t author = 0, round = 7, tokens = 4096;
    uint32_t part = 1;
    std::vector<Bytes> pieces{bytes_of("the 64-byte header"), bytes_of("chunk one"),
                              bytes_of("chunk two")};
};

Signature sign(const NodeIdentity& author, const Message& m) {
    MessageDigest digest(m.author, m.round, m.part, m.tokens);
    for (const Bytes& piece : m.pieces) digest.add(piece);
    return digest.sign(author);
}

bool verifies(const PublicKey& key, const Message& m, const Signature& signature) {
    MessageDigest digest(m.author, m.round, m.part, m.tokens);
    for (const Bytes& piece : m.pieces) digest.add(piece);
    return digest.verify(key, signature);
}

}  // namespace

TEST_CASE("a message signature is Ed25519 of SHA-256 over the documented layout") {
    const NodeIdentity author = NodeIdentity::generate();
    Message m;
    m.author = author.node_id();
    const Signature signature = sign(author, m);

    // "starling round message v1", author, round, part, tokens as u64 little-endian, then each
    // piece's length (u64 little-endian) and bytes.
    const std::string domain = "starling round message v1";
    std::vector<unsigned char> layout(domain.begin(), domain.end());
    for (uint64_t v : {m.author, m.round, uint64_t{m.part}, m.tokens}) append_u64(layout, v);
    for (const Bytes& piece : m.pieces) {
        append_u64(layout, piece.size());
        for (std::byte b : piece) layout.push_back(static_cast<unsigned char>(b));
    }
    unsigned char digest[SHA256_DIGEST_LENGTH];
    SHA256(layout.data(), layout.size(), digest);
    CHECK(crypto_sign_verify_detached(signature.data(), digest, sizeof digest,
                                      author.public_key().data()) == 0);
    CHECK(verifies(author.public_key(), m, signature));
}

TEST_CASE("a message signature fails for any change a relay could make") {
    const NodeIdentity author = NodeIdentity::generate();
    Message m;
    m.author = author.node_id();
    const Signature signature = sign(author, m);
    REQUIRE(verifies(author.public_key(), m, signature));

    SECTION("another key") {
        CHECK_FALSE(verifies(NodeIdentity::generate().public_key(), m, signature));
    }
    SECTION("signed by another node in the author's name") {
        CHECK_FALSE(verifies(author.public_key(), m, sign(NodeIdentity::generate(), m)));
    }
    SECTION("the same message for another round, or replayed as the other part") {
        Message other = m;
        other.round = m.round + 1;
        CHECK_FALSE(verifies(author.public_key(), other, signature));
        other = m;
        other.part = 0;
        CHECK_FALSE(verifies(author.public_key(), other, signature));
    }
    SECTION("an inflated token claim") {
        Message other = m;
        other.tokens = m.tokens * 10;
        CHECK_FALSE(verifies(author.public_key(), other, signature));
    }
    SECTION("one byte of a chunk") {
        Message other = m;
        other.pieces[2][3] ^= std::byte{0x01};
        CHECK_FALSE(verifies(author.public_key(), other, signature));
    }
    SECTION("a byte moved from one chunk to the next") {
        Message other = m;
        other.pieces[2].insert(other.pieces[2].begin(), other.pieces[1].back());
        other.pieces[1].pop_back();
        CHECK_FALSE(verifies(author.public_key(), other, signature));
    }
    SECTION("a chunk left out") {
        Message other = m;
        other.pieces.pop_back();
        CHECK_FALSE(verifies(author.public_key(), other, signature));
    }
    SECTION("a signature cut short") {
        MessageDigest digest(m.author, m.round, m.part, m.tokens);
        for (const Bytes& piece : m.pieces) digest.add(piece);
        CHECK_FALSE(digest.verify(author.public_key(), std::span(signature).first(63)));
    }
}
