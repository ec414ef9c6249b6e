#include <catch2/catch.hpp>
#include <cstdint>
#include <filesystem>
#include <set>

#include "common/error.h"
#include "peer/address.h"
#include "tests/support/fuzz_corpus.h"

using namespace starling;

TEST_CASE("host:port parsing accepts names, IPv4 and bracketed IPv6 and nothing else") {
    REQUIRE(parse_host_port("node-3.example:7000")->host == "node-3.example");
    REQUIRE(parse_host_port("10.0.0.2:65535")->port == 65535);
    const auto v6 = parse_host_port("[::1]:7000");
    REQUIRE(v6->host == "::1");
    REQUIRE(v6->str() == "[::1]:7000");
    for (const char* bad : {"", "host", "host:", ":7000", "host:70000", "host:7x", "::1:7000",
                            "[]:1", "[::1:7", "[[x]]:1", "a]b:80", "[a]b]:1"})
        REQUIRE_FALSE(parse_host_port(bad).has_value());
}

TEST_CASE("loopback and wildcard hosts are recognised") {
    REQUIRE(is_loopback_host("127.0.0.1"));
    REQUIRE(is_loopback_host("127.5.0.9"));
    REQUIRE(is_loopback_host("::1"));
    REQUIRE(is_loopback_host("localhost"));
    REQUIRE_FALSE(is_loopback_host("10.0.0.1"));
    REQUIRE_FALSE(is_loopback_host("128.0.0.1"));
    REQUIRE(is_wildcard_host("0.0.0.0"));
    REQUIRE(is_wildcard_host("::"));
    REQUIRE_FALSE(is_wildcard_host("127.0.0.1"));
}

TEST_CASE("the announce address is one peers can dial, or a clear error") {
    REQUIRE(choose_announce_address("127.0.0.1:0", "", 4711, {}) == "127.0.0.1:4711");
    REQUIRE(choose_announce_address("127.0.0.1:0", "", 4711, {"127.0.0.1:7000"}) ==
            "127.0.0.1:4711");
    REQUIRE(choose_announce_address("0.0.0.0:7000", "10.0.0.5:7000", 7000, {"10.0.0.2:7000"}) ==
            "10.0.0.5:7000");

    const auto refuses = [](const char* listen, const char* announce,
                            std::vector<std::string> seeds, const char* words) {
        try {
            choose_announce_address(listen, announce, 7000, seeds);
            FAIL("accepted listen " << listen << " announce " << announce);
        } catch (const Error& e) {
            REQUIRE_THAT(e.what(), Catch::Contains(words));
        }
    };
    refuses("0.0.0.0:7000", "", {}, "set peer.announce");
    refuses("127.0.0.1:7000", "", {"10.0.0.2:7000"}, "could never reach it");
    refuses("0.0.0.0:7000", "localhost:7000", {"node-1:7000"}, "could never reach it");
    refuses("127.0.0.1:7000", "10.0.0.5:7000", {}, "accepts only local connections");
    refuses("nonsense", "", {}, "peer.listen");
    refuses("0.0.0.0:7000", "0.0.0.0:7000", {}, "peer.announce");
}

TEST_CASE("a seed resolves to every address of its host, as gRPC targets") {
    REQUIRE(resolve_seed_targets("127.0.0.1:7700") ==
            std::vector<std::string>{"ipv4:127.0.0.1:7700"});
    REQUIRE(resolve_seed_targets("[::1]:7700") == std::vector<std::string>{"ipv6:[::1]:7700"});
    // /etc/hosts names localhost on every machine; it may give ::1 as well, never twice the same.
    const auto local = resolve_seed_targets("localhost:7700");
    REQUIRE_FALSE(local.empty());
    for (const std::string& target : local)
        REQUIRE((target == "ipv4:127.0.0.1:7700" || target == "ipv6:[::1]:7700"));
    REQUIRE(std::set<std::string>(local.begin(), local.end()).size() == local.size());
    // .invalid never resolves (RFC 6761), and a malformed seed gives nothing to dial.
    REQUIRE(resolve_seed_targets("no-such-node.invalid:7700").empty());
    REQUIRE(resolve_seed_targets("127.0.0.1").empty());
}

// tests/peer/fuzz_host_port.cpp, compiled into this suite as into the fuzzer.
bool fuzz_host_port_valid(const uint8_t* data, size_t size);

TEST_CASE("every host:port fuzz input parses and prints back, or is refused") {
    const auto corpus = std::filesystem::path(STARLING_SOURCE_DIR) / "tests/peer/host-port-corpus";
    const test::CorpusReplay replay = test::replay_fuzz_corpus(corpus, fuzz_host_port_valid);
    CHECK(replay.files >= 8);
    CHECK(replay.valid_seeds >= 3);
}
