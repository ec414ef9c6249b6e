// The peer port's accept loop: connections that carry no authenticated call are capped, in all
// and per source address, and closed when their time is up; authenticated ones are left alone.
#include <sys/resource.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include "peer/connection_gate.h"
#include "peer/local_cluster.h"
#include "tests/peer/cluster_util.h"
#include "tests/support/raw_tcp.h"
#include "tests/support/sanitizer.h"

using namespace starling;
using namespace starling::test;
using namespace std::chrono_literals;

namespace {

bool sent_preface(int fd) {
    const char preface[] = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
    return write(fd, preface, sizeof(preface) - 1) == static_cast<ssize_t>(sizeof(preface) - 1);
}

// Whether the node sent anything or closed the connection (gRPC has it: these bytes are no TLS
// hello) within `limit`.
bool answered_within(int fd, std::chrono::milliseconds limit) {
    pollfd p{fd, POLLIN, 0};
    return poll(&p, 1, static_cast<int>(limit.count())) == 1 && (p.revents & POLLIN);
}

uint16_t port_of(const PeerNode& node) {
    return static_cast<uint16_t>(std::stoi(node.address().substr(node.address().rfind(':') + 1)));
}

uint64_t connections_closed(const PeerNode& node) {
    return node.failures()[static_cast<size_t>(FailureReason::Connection)];
}

}  // namespace

TEST_CASE("a gRPC peer string names the connection the gate accepted") {
    CHECK(connection_key_of_grpc_peer("ipv4:127.0.0.1:7700") == "127.0.0.1 7700");
    CHECK(connection_key_of_grpc_peer("ipv6:%5B::1%5D:7700") == "::1 7700");
    CHECK(connection_key_of_grpc_peer("ipv6:[::1]:7700") == "::1 7700");
    CHECK(connection_key_of_grpc_peer("ipv6:%5Bfd00::5%5D:1") == "fd00::5 1");
    // A dual-stack listener sees IPv4 callers as mapped IPv6 addresses.
    CHECK(connection_key_of_grpc_peer("ipv6:%5B::ffff:10.0.0.1%5D:9") == "10.0.0.1 9");
    CHECK_FALSE(connection_key_of_grpc_peer("unix:/run/starling.sock"));
    CHECK_FALSE(connection_key_of_grpc_peer("ipv4:10.0.0.1"));
    CHECK_FALSE(connection_key_of_grpc_peer("ipv4:10.0.0.1:70000"));
    CHECK_FALSE(connection_key_of_grpc_peer("ipv4:not-an-address:7700"));
    CHECK_FALSE(connection_key_of_grpc_peer(""));
}

TEST_CASE(
    "connections beyond the cap on unauthenticated ones are closed at once, the rest when "
    "their time is up, and authenticated ones are left alone") {
    PeerConfig config = local_cluster_config();
    config.connections.max_unauthenticated = 4;
    config.connections.max_unauthenticated_per_source = 100;
    config.connections.authenticate_within = 1500ms;
    LocalCluster cluster(1, config);
    PeerNode& node = cluster.node(0);
    const uint16_t port = port_of(node);

    // Connections that send nothing, as strangers who cannot finish the TLS handshake would: each
    // holds a place until its time is up.
    std::vector<std::unique_ptr<RawConnection>> held;
    for (int i = 0; i < 4; i++) held.push_back(std::make_unique<RawConnection>(port));
    const RawConnection fifth(port);
    CHECK(fifth.closed_within(1000ms));
    for (const auto& connection : held) CHECK_FALSE(connection->closed_within(10ms));
    CHECK(connections_closed(node) == 1);
    // Out of time: 1.5 s after they came, and the sweep a quarter of a second later at most.
    for (const auto& connection : held) CHECK(connection->closed_within(3000ms));
    CHECK(connections_closed(node) == 5);

    // A member's connections authenticate with their first call and stop counting: all four
    // places are free for strangers again, and nothing of the member's is cut.
    PeerConfig second = config;
    second.seeds = {node.address()};
    PeerNode& member = cluster.add(second);
    wait_for("the member is seen", 20000ms, [&] { return all_see_all_alive({&node, &member}); });
    held.clear();
    for (int i = 0; i < 4; i++) held.push_back(std::make_unique<RawConnection>(port));
    for (const auto& connection : held) CHECK_FALSE(connection->closed_within(200ms));
    std::this_thread::sleep_for(2000ms);
    wait_for("the member alive", 20000ms, [&] { return all_see_all_alive({&node, &member}); });
    CHECK(connections_closed(node) == 9);  // only the four strangers, cut when out of time
}

TEST_CASE("a connection out of time is closed only once places are in demand") {
    PeerConfig config = local_cluster_config();
    config.connections.max_unauthenticated = 8;
    config.connections.max_unauthenticated_per_source = 100;
    config.connections.authenticate_within = 300ms;
    LocalCluster cluster(1, config);
    PeerNode& node = cluster.node(0);
    const uint16_t port = port_of(node);

    // Three of eight places held: a slow handshake may go on past its time (gRPC's own handshake
    // timeout, 5 s later, would end it).
    std::vector<std::unique_ptr<RawConnection>> slow;
    for (int i = 0; i < 3; i++) slow.push_back(std::make_unique<RawConnection>(port));
    for (const auto& connection : slow) CHECK_FALSE(connection->closed_within(400ms));
    CHECK(connections_closed(node) == 0);
    // A fourth makes half: the three out of time give way (the fourth too, where a busy machine
    // delays the sweep past its own time).
    const RawConnection fourth(port);
    for (const auto& connection : slow) CHECK(connection->closed_within(3000ms));
    CHECK(connections_closed(node) >= 3);
}

TEST_CASE("one source address holds no more unauthenticated connections than its cap") {
    PeerConfig config = local_cluster_config();
    config.connections.max_unauthenticated = 100;
    config.connections.max_unauthenticated_per_source = 2;
    LocalCluster cluster(1, config);
    const uint16_t port = port_of(cluster.node(0));

    const RawConnection first(port), second(port), third(port);
    CHECK(third.closed_within(1000ms));
    const RawConnection elsewhere(port, "127.0.0.2");
    CHECK_FALSE(elsewhere.closed_within(200ms));
    CHECK_FALSE(first.closed_within(10ms));
    CHECK_FALSE(second.closed_within(10ms));
    CHECK(connections_closed(cluster.node(0)) == 1);
}

TEST_CASE("the peer port refuses an address another listener holds") {
    PeerConfig config = local_cluster_config();
    LocalCluster cluster(1, config);
    config.listen = cluster.node(0).address();
    PeerNode second(config);
    CHECK_THROWS_WITH(second.start(), Catch::Contains("cannot listen on " + config.listen));
    CHECK(cluster.node(0).members().size() == 1);
}

TEST_CASE("the peer port keeps accepting once descriptors free up after running out") {
    if (kSanitizerNeedsDescriptors) {
        WARN("skipped: UBSan needs descriptors for its own checks");
        return;
    }
    LocalCluster cluster(1);
    const uint16_t port = port_of(cluster.node(0));
    // The callers' sockets exist before the limit falls; connecting them takes no descriptor here,
    // but accepting them would.
    std::vector<int> callers;
    for (int i = 0; i < 3; i++) {
        callers.push_back(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
        REQUIRE(callers.back() >= 0);
    }
    rlimit saved{};
    REQUIRE(getrlimit(RLIMIT_NOFILE, &saved) == 0);
    // A new descriptor takes the lowest free number, and none at or above the limit is given.
    const int lowest_free = dup(0);
    REQUIRE(lowest_free >= 0);
    close(lowest_free);
    rlimit none_left = saved;
    none_left.rlim_cur = static_cast<rlim_t>(lowest_free);
    REQUIRE(setrlimit(RLIMIT_NOFILE, &none_left) == 0);
    const sockaddr_in to = loopback(port);
    // Nothing here may throw until the limit is back: the test binary's other cases need it.
    bool connected = true;
    for (const int fd : callers)
        connected = connected &&
                    connect(fd, reinterpret_cast<const sockaddr*>(&to), sizeof(to)) == 0 &&
                    sent_preface(fd);
    // accept() fails with EMFILE meanwhile: the connections wait in the listen queue.
    const bool answered_while_out = answered_within(callers.front(), 300ms);
    REQUIRE(setrlimit(RLIMIT_NOFILE, &saved) == 0);
    CHECK(connected);
    CHECK_FALSE(answered_while_out);
    for (const int fd : callers) CHECK(answered_within(fd, 2000ms));
    for (const int fd : callers) close(fd);
    CHECK(cluster.node(0).members().size() == 1);
}

TEST_CASE(
    "with every place taken, a connection from an address holding fewer takes the place of the "
    "oldest from the address holding the most") {
    PeerConfig config = local_cluster_config();
    config.connections.max_unauthenticated = 4;
    config.connections.max_unauthenticated_per_source = 100;
    LocalCluster cluster(1, config);
    PeerNode& node = cluster.node(0);
    const uint16_t port = port_of(node);

    std::vector<std::unique_ptr<RawConnection>> from_2;
    for (int i = 0; i < 3; i++) {
        from_2.push_back(std::make_unique<RawConnection>(port, "127.0.0.2"));
        // Each admitted before the next comes, so their age is their order.
        CHECK_FALSE(from_2.back()->closed_within(50ms));
    }
    const RawConnection from_3(port, "127.0.0.3");
    CHECK_FALSE(from_3.closed_within(50ms));

    // 127.0.0.4 holds none, 127.0.0.2 the most: its oldest gives way.
    const RawConnection from_4(port, "127.0.0.4");
    CHECK(from_2[0]->closed_within(2000ms));
    CHECK_FALSE(from_4.closed_within(200ms));
    CHECK(connections_closed(node) == 1);
    // 127.0.0.2 holds 2 now, as many as any: it takes no place from another.
    const RawConnection another_from_2(port, "127.0.0.2");
    CHECK(another_from_2.closed_within(2000ms));
    CHECK(connections_closed(node) == 2);
    for (size_t i = 1; i < from_2.size(); i++) CHECK_FALSE(from_2[i]->closed_within(10ms));
    CHECK_FALSE(from_3.closed_within(10ms));

    // A connection its caller closed frees its place at once, not at the gate's next look.
    from_2.clear();
    const RawConnection from_5(port, "127.0.0.5");
    CHECK_FALSE(from_5.closed_within(200ms));
    CHECK(connections_closed(node) == 2);
}

TEST_CASE("members' addresses have places of their own that strangers cannot take") {
    PeerConfig config = local_cluster_config();
    config.connections.max_unauthenticated = 2;
    config.connections.max_unauthenticated_per_source = 100;
    config.connections.reserved_for_members = 2;
    LocalCluster cluster(1, config);
    PeerNode& node = cluster.node(0);
    const uint16_t port = port_of(node);
    // A member on 127.0.0.1 makes that address a member's.
    PeerConfig second = config;
    second.seeds = {node.address()};
    PeerNode& member = cluster.add(second);
    wait_for("the member is seen", 20000ms, [&] { return all_see_all_alive({&node, &member}); });
    // Each has had the other dial it back (peer/reachability_watch.h): no dial-back connection
    // of theirs takes a place below, which the counts assume.
    wait_for("both reachability verdicts", 20000ms, [&] {
        return node.reachability().state == Reachability::Public &&
               member.reachability().state == Reachability::Public;
    });

    const RawConnection stranger_a(port, "127.0.0.2"), stranger_b(port, "127.0.0.2");
    CHECK_FALSE(stranger_b.closed_within(50ms));
    const uint64_t closed_before = connections_closed(node);
    // The strangers' two places are taken; the member's address has two more.
    const RawConnection member_a(port), member_b(port);
    CHECK_FALSE(member_a.closed_within(200ms));
    CHECK_FALSE(member_b.closed_within(10ms));
    const RawConnection member_c(port);
    CHECK(member_c.closed_within(2000ms));
    // 127.0.0.2 holds the most strangers' places, and none of the members'.
    const RawConnection stranger_c(port, "127.0.0.2");
    CHECK(stranger_c.closed_within(2000ms));
    CHECK(connections_closed(node) == closed_before + 2);
    CHECK_FALSE(stranger_a.closed_within(10ms));
    wait_for("the member alive", 20000ms, [&] { return all_see_all_alive({&node, &member}); });
}

TEST_CASE("a node joins past a flood of idle connections from many addresses") {
    PeerConfig config = local_cluster_config();
    config.connections.max_unauthenticated = 16;
    config.connections.max_unauthenticated_per_source = 16;
    // Long past the join's bound: the flood's connections do not run out of time during it.
    config.connections.authenticate_within = 120000ms;
    LocalCluster cluster(1, config);
    PeerNode& node = cluster.node(0);
    const uint16_t port = port_of(node);
    std::vector<std::unique_ptr<RawConnection>> flood;
    for (int source = 2; source < 42; source++)
        for (int i = 0; i < 5; i++)
            flood.push_back(std::make_unique<RawConnection>(
                port, ("127.0.0." + std::to_string(source)).c_str()));
    // All but the 16 it holds closed, refused or made to give way.
    wait_for("the gate takes the flood in", 20000ms,
             [&] { return connections_closed(node) == flood.size() - 16; });

    PeerConfig joiner = config;
    joiner.seeds = {node.address()};
    PeerNode& member = cluster.add(joiner);
    wait_for("the joiner is seen", 20000ms, [&] { return all_see_all_alive({&node, &member}); });
}
