// Reachability: the verdict from members' dial-backs (peer/reachability.h), the dial-back's
// preamble and its way through the peer port's gate (peer/dial_back.h), and real nodes on
// loopback that learn whether members can dial the address they announce.
#include <catch2/catch.hpp>

#include <thread>

#include "peer/connection_gate.h"
#include "peer/dial_back.h"
#include "peer/local_cluster.h"
#include "peer/reachability.h"
#include "tests/peer/cluster_util.h"
#include "tests/support/raw_tcp.h"

using namespace starling;
using namespace starling::test;
using namespace std::chrono_literals;

namespace {

DialBackResult answered(uint64_t helper, std::string error, bool arrived,
                        std::string observed = "10.0.0.9") {
    DialBackResult r;
    r.helper = helper;
    r.answered = true;
    r.error = std::move(error);
    r.arrived = arrived;
    r.observed = std::move(observed);
    return r;
}

DialBackResult unanswered(uint64_t helper) {
    DialBackResult r;
    r.helper = helper;
    r.error = "Deadline Exceeded";
    return r;
}

std::vector<std::uint8_t> preamble_of(const DialBackNonce& nonce) {
    std::vector<std::uint8_t> bytes(kDialBackMagic.begin(), kDialBackMagic.end());
    bytes.insert(bytes.end(), nonce.begin(), nonce.end());
    return bytes;
}

std::optional<Reachability> reachability_seen(const PeerNode& observer, uint64_t node_id) {
    for (const Member& m : observer.members())
        if (m.node_id == node_id) return m.reachability;
    return std::nullopt;
}

}  // namespace

TEST_CASE("one member's dial that reached this node makes it public") {
    const std::vector<DialBackResult> results = {answered(1, "Connection refused", false),
                                                 answered(2, "", true), unanswered(3)};
    const ReachabilityVerdict verdict = judge_reachability("10.0.0.5:7000", results, 5);
    CHECK(verdict.state == Reachability::Public);
    CHECK_THAT(verdict.detail, Catch::Contains("10.0.0.5:7000"));
}

TEST_CASE("private takes two failed dials, or every other member's when there are fewer") {
    const std::vector<DialBackResult> one = {answered(1, "Connection refused", false)};
    CHECK(judge_reachability("10.0.0.5:7000", one, 5).state == Reachability::Unknown);
    // The only other member could not dial it: nobody else could tell otherwise.
    CHECK(judge_reachability("10.0.0.5:7000", one, 1).state == Reachability::Private);

    const std::vector<DialBackResult> two = {
        answered(1, "Connection refused", false),
        answered(2, "no answer within 3000 ms", false, "203.0.113.7")};
    const ReachabilityVerdict verdict = judge_reachability("10.0.0.5:7000", two, 5);
    CHECK(verdict.state == Reachability::Private);
    CHECK_THAT(verdict.detail, Catch::Contains("10.0.0.5:7000"));
    CHECK_THAT(verdict.detail, Catch::Contains("Connection refused"));
    CHECK_THAT(verdict.detail, Catch::Contains("no answer within 3000 ms"));
    CHECK(verdict.observed == std::set<std::string>{"10.0.0.9", "203.0.113.7"});
}

TEST_CASE("calls that failed prove nothing either way") {
    const std::vector<DialBackResult> results = {unanswered(1), unanswered(2), unanswered(3)};
    CHECK(judge_reachability("10.0.0.5:7000", results, 3).state == Reachability::Unknown);
    CHECK(judge_reachability("10.0.0.5:7000", {}, 0).state == Reachability::Unknown);
}

TEST_CASE("members that cannot be called are not waited for: one public member's dial decides") {
    // One public member, which could not dial this node, and two private ones not yet known as
    // such, whose calls fail: they cannot be asked, so the public one's answer is every answer.
    const std::vector<DialBackResult> results = {answered(1, "Network is unreachable", false),
                                                 unanswered(2), unanswered(3)};
    CHECK(judge_reachability("10.0.0.5:7000", results, 3).state == Reachability::Private);
    // Among more members that can be asked, one failed dial is still not enough.
    CHECK(judge_reachability("10.0.0.5:7000", results, 5).state == Reachability::Unknown);
    // A dial that reached this node wins whatever failed.
    const std::vector<DialBackResult> reached = {answered(1, "", true), unanswered(2)};
    CHECK(judge_reachability("10.0.0.5:7000", reached, 2).state == Reachability::Public);
}

TEST_CASE("a dial that connected but never reached this node says another box answers there") {
    const std::vector<DialBackResult> results = {answered(1, "", false), answered(2, "", false)};
    const ReachabilityVerdict verdict = judge_reachability("10.0.0.5:7000", results, 4);
    CHECK(verdict.state == Reachability::Private);
    CHECK_THAT(verdict.detail, Catch::Contains("another process or machine answers"));
}

TEST_CASE("a dial-back preamble is told from TLS and HTTP/2 by its first bytes") {
    const DialBackNonce nonce = random_dial_back_nonce();
    const std::vector<std::uint8_t> preamble = preamble_of(nonce);
    CHECK(preamble.size() == kDialBackPreambleBytes);
    CHECK(classify_preamble(preamble) == Preamble::DialBack);
    CHECK(nonce_of_preamble(preamble) == nonce);
    CHECK(classify_preamble(std::span(preamble).first(3)) == Preamble::Incomplete);
    CHECK(classify_preamble(std::span(preamble).first(kDialBackMagic.size())) ==
          Preamble::Incomplete);
    const std::vector<std::uint8_t> tls_hello = {0x16, 0x03, 0x01, 0x02, 0x00};
    CHECK(classify_preamble(tls_hello) == Preamble::Other);
    const std::string preface = "PRI * HTTP/2.0\r\n";
    CHECK(classify_preamble({reinterpret_cast<const std::uint8_t*>(preface.data()),
                             preface.size()}) == Preamble::Other);
    // One byte of the magic then something else is no dial-back.
    std::vector<std::uint8_t> almost = preamble;
    almost[3] ^= 0xff;
    CHECK(classify_preamble(almost) == Preamble::Other);
}

TEST_CASE("the gate hands a dial-back's nonce to the inbox, whole or in pieces") {
    ConnectionGate gate("127.0.0.1:0", {});
    DialBackInbox inbox;
    gate.start(nullptr, {}, &inbox);
    const std::string address = "127.0.0.1:" + std::to_string(gate.port());

    const DialBackNonce sent = random_dial_back_nonce();
    CHECK(dial_back(address, sent, 2000ms).empty());
    CHECK(inbox.wait_for(sent, 2000ms));
    CHECK_FALSE(inbox.wait_for(random_dial_back_nonce(), 50ms));

    // The preamble in two writes, the nonce 100 ms after the magic.
    const DialBackNonce split = random_dial_back_nonce();
    const std::vector<std::uint8_t> preamble = preamble_of(split);
    RawConnection connection(gate.port());
    REQUIRE(connection.send(std::string(preamble.begin(), preamble.begin() + 5)));
    std::this_thread::sleep_for(100ms);
    CHECK_FALSE(inbox.wait_for(split, 10ms));
    REQUIRE(connection.send(std::string(preamble.begin() + 5, preamble.end())));
    CHECK(inbox.wait_for(split, 2000ms));
    // Closed once read: nothing else is said on a dial-back's connection.
    CHECK(connection.closed_within(2000ms));
    gate.stop();
}

TEST_CASE("a dial-back to an address nobody listens at names the failure") {
    const std::string nowhere = "127.0.0.1:" + std::to_string(free_port());
    CHECK_THAT(dial_back(nowhere, random_dial_back_nonce(), 2000ms), Catch::Contains("refused"));
    CHECK_THAT(dial_back("not an address", random_dial_back_nonce(), 2000ms),
               Catch::Contains("not host:port"));
}

TEST_CASE("nodes whose announced address members can dial learn they are public, and say so") {
    LocalCluster cluster(3);
    wait_for("each node's verdict", 15000ms, [&] {
        for (size_t i = 0; i < cluster.size(); i++)
            if (cluster.node(i).reachability().state != Reachability::Public) return false;
        return true;
    });
    // Gossip carries each one's verdict to the others.
    wait_for("the verdicts gossiped", 15000ms, [&] {
        for (size_t i = 0; i < cluster.size(); i++)
            for (size_t j = 0; j < cluster.size(); j++)
                if (reachability_seen(cluster.node(i), cluster.node(j).node_id()) !=
                    Reachability::Public)
                    return false;
        return true;
    });
}

TEST_CASE("a node that announces an address where nothing listens learns it is private") {
    LocalCluster cluster(2);
    PeerConfig wrong = cluster.base();
    wrong.seeds = {cluster.node(0).address()};
    const std::string nowhere = "127.0.0.1:" + std::to_string(free_port());
    wrong.announce = nowhere;
    PeerNode& node = cluster.add(wrong);
    wait_for("its verdict", 20000ms,
             [&] { return node.reachability().state == Reachability::Private; });
    const ReachabilityVerdict verdict = node.reachability();
    CHECK_THAT(verdict.detail, Catch::Contains(nowhere));
    CHECK_THAT(verdict.detail, Catch::Contains("refused"));
    CHECK_THAT(verdict.detail, Catch::Contains("[peer].announce"));
}

TEST_CASE("a node whose announced address reaches another listener learns it is private") {
    // A listening socket that is not this node's: the kernel completes each connection and the
    // preamble lands there, never at the node.
    ConnectionGate stranger("127.0.0.1:0", {});
    stranger.start(nullptr);
    LocalCluster cluster(2);
    PeerConfig wrong = cluster.base();
    wrong.seeds = {cluster.node(0).address()};
    wrong.announce = "127.0.0.1:" + std::to_string(stranger.port());
    PeerNode& node = cluster.add(wrong);
    wait_for("its verdict", 20000ms,
             [&] { return node.reachability().state == Reachability::Private; });
    CHECK_THAT(node.reachability().detail, Catch::Contains("another process or machine answers"));
}

TEST_CASE("a private node beside another learns it is private from the one public member") {
    // The public member is the only one that can be asked: the first private node's verdict
    // must not make the second wait for a second failed dial that nobody can make.
    LocalCluster cluster(1);
    auto hidden = [&] {
        PeerConfig config = cluster.base();
        config.seeds = {cluster.node(0).address()};
        config.announce = "127.0.0.1:" + std::to_string(free_port());
        return config;
    };
    auto alive_and_private = [](const PeerNode& observer, uint64_t node_id) {
        for (const Member& m : observer.members())
            if (m.node_id == node_id)
                return m.state == MemberState::Alive && m.reachability == Reachability::Private;
        return false;
    };
    PeerNode& first = cluster.add(hidden());
    wait_for("the first one known alive and private", 30000ms,
             [&] { return alive_and_private(cluster.node(0), first.node_id()); });
    PeerNode& second = cluster.add(hidden());
    wait_for("the second one's verdict", 30000ms,
             [&] { return second.reachability().state == Reachability::Private; });
    CHECK_THAT(second.reachability().detail,
               Catch::Contains(format_node_id(cluster.node(0).node_id())));
    // And the two private nodes, which can only reach each other through the public one, come
    // to hold each other alive.
    wait_for("each private node alive to the other", 30000ms, [&] {
        return alive_and_private(second, first.node_id()) &&
               alive_and_private(first, second.node_id());
    });
}
