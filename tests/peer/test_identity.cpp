#include <sodium.h>
#include <sys/stat.h>

#include <catch2/catch.hpp>
#include <fstream>

#include "common/atomic_file.h"
#include "common/error.h"
#include "peer/identity.h"
#include "tests/support/files.h"

using namespace starling;

TEST_CASE("node id is the first 8 bytes of BLAKE2b-256 of the public key, little-endian") {
    const NodeIdentity identity = NodeIdentity::generate();
    ensure_sodium();
    unsigned char hash[32];
    crypto_generichash(hash, 32, identity.public_key().data(), identity.public_key().size(),
                       nullptr, 0);
    uint64_t expected = 0;
    for (int i = 0; i < 8; ++i) expected |= uint64_t(hash[i]) << (8 * i);
    REQUIRE(identity.node_id() == expected);
    REQUIRE(format_node_id(0x00ab) == "00000000000000ab");
    REQUIRE(NodeIdentity::generate().node_id() != identity.node_id());
}

TEST_CASE("a node key is created once with mode 0600 and the same identity comes back") {
    test::TempDir dir;
    const NodeIdentity first = NodeIdentity::load_or_create(dir.path() / "data");
    struct stat info {};
    REQUIRE(stat((dir.path() / "data" / "node.key").c_str(), &info) == 0);
    REQUIRE((info.st_mode & 0777) == 0600);
    const NodeIdentity again = NodeIdentity::load_or_create(dir.path() / "data");
    REQUIRE(again.node_id() == first.node_id());
    REQUIRE(again.public_key() == first.public_key());
}

TEST_CASE("signatures verify with the right key and message only") {
    const NodeIdentity identity = NodeIdentity::generate();
    const std::string text = "round 7";
    const std::span message(reinterpret_cast<const unsigned char*>(text.data()), text.size());
    Signature signature = identity.sign(message);
    REQUIRE(verify_signature(identity.public_key(), message, signature));
    REQUIRE_FALSE(verify_signature(NodeIdentity::generate().public_key(), message, signature));
    signature[3] ^= 1;
    REQUIRE_FALSE(verify_signature(identity.public_key(), message, signature));
    REQUIRE_FALSE(verify_signature(identity.public_key(), message, std::span(signature).first(10)));
}

TEST_CASE("a damaged node key is an error naming the file, never a new identity") {
    test::TempDir dir;
    NodeIdentity::load_or_create(dir.path());
    const auto path = dir.path() / "node.key";
    auto bytes = read_file_bytes(path);

    SECTION("truncated") { bytes.resize(40); }
    SECTION("public half altered") { bytes[50] ^= std::byte{0x10}; }
    write_file_atomic(path, bytes);
    try {
        NodeIdentity::load_or_create(dir.path());
        FAIL("a damaged key was accepted");
    } catch (const Error& e) {
        REQUIRE_THAT(e.what(), Catch::Contains("node.key") && Catch::Contains("damaged"));
    }
}
