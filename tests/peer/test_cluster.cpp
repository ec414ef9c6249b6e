// Real nodes, each a gRPC server on 127.0.0.1, gossiping every 100 ms (local_cluster_config).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <catch2/catch.hpp>
#include <filesystem>

#include "common/atomic_file.h"
#include "common/error.h"
#include "peer/local_cluster.h"
#include "peer/wire.h"
#include "tests/peer/cluster_util.h"
#include "tests/support/files.h"

using namespace starling;
using namespace starling::test;
using namespace std::chrono_literals;

TEST_CASE("eight nodes converge to one membership view") {
    LocalCluster cluster(8);
    const auto nodes = nodes_of(cluster);
    const auto took = wait_for(
        "one view", 3000ms, [&] { return all_see_all_alive(nodes) && same_pairable_view(nodes); });
    WARN("8 nodes agreed on membership " << took.count() << " ms after the last one started");
}

TEST_CASE(
    "refresh learns a member's round and step time at once, where gossip is an interval late") {
    PeerConfig slow_gossip = local_cluster_config();
    slow_gossip.gossip_interval = 60s;  // no gossip or probe during the test: only the join
    LocalCluster cluster(2, slow_gossip);
    PeerNode& asking = cluster.node(0);
    PeerNode& member = cluster.node(1);
    wait_for("each knows the other from the join", 20000ms, [&] {
        return asking.pairable_ids().size() == 2 && member.pairable_ids().size() == 2;
    });
    member.rounds().advertise(7);
    member.set_step_seconds(0.25);
    auto seen = [&] {
        for (const Member& m : asking.members())
            if (m.node_id == member.node_id()) return m;
        FAIL("the member is gone from the view");
        return Member{};
    };
    REQUIRE(seen().round == 0);
    asking.refresh({member.node_id()});
    CHECK(seen().round == 7);
    CHECK(seen().step_seconds == 0.25);
    CHECK(asking.pairable_step_seconds() == std::vector<double>{0.25});
}

TEST_CASE("membership_sent_bytes counts the payload of a call made and of the answer given") {
    PeerConfig slow_gossip = local_cluster_config();
    slow_gossip.gossip_interval = 60s;  // few calls besides the join and the one below
    LocalCluster cluster(2, slow_gossip);
    PeerNode& asking = cluster.node(0);
    PeerNode& member = cluster.node(1);
    wait_for("each knows the other from the join", 20000ms, [&] {
        return asking.pairable_ids().size() == 2 && member.pairable_ids().size() == 2;
    });
    REQUIRE(asking.membership_sent_bytes() > 0);  // the join's request or answer
    const uint64_t asked_before = asking.membership_sent_bytes();
    const uint64_t answered_before = member.membership_sent_bytes();
    asking.refresh({member.node_id()});  // one Ping, one answer carrying the member's digest
    v1::PingRequest ping;
    ping.set_target_id(member.node_id());
    v1::PingResponse answer;
    for (const Member& m : member.members())
        if (m.node_id == member.node_id()) to_digest(m, answer.mutable_self());
    // At least these: the protocol thread's first period may fall in between too.
    CHECK(asking.membership_sent_bytes() - asked_before >= ping.ByteSizeLong());
    CHECK(member.membership_sent_bytes() - answered_before >= answer.ByteSizeLong());
}

TEST_CASE("a killed node is declared dead within its timeout and never paired afterwards") {
    LocalCluster cluster(5);
    const auto nodes = nodes_of(cluster);
    wait_for("one view", 20000ms, [&] { return all_see_all_alive(nodes); });
    const uint64_t victim = cluster.node(4).node_id();
    cluster.node(4).kill();
    const std::vector<PeerNode*> survivors(nodes.begin(), nodes.begin() + 4);
    // Found within a few probe rounds, then suspected for the suspicion timeout.
    const auto took = wait_for("declared dead", 20000ms, [&] {
        return std::all_of(survivors.begin(), survivors.end(), [&](PeerNode* n) {
            return state_seen(*n, victim) == MemberState::Dead;
        });
    });
    WARN("a killed node was declared dead by all 4 survivors after " << took.count() << " ms");
    for (int i = 0; i < 20; ++i) {
        for (PeerNode* n : survivors) {
            const auto ids = n->pairable_ids();
            REQUIRE(std::find(ids.begin(), ids.end(), victim) == ids.end());
            REQUIRE(ids.size() == 4);
        }
        std::this_thread::sleep_for(50ms);
    }
    // And partner choice over the survivors' view never names it: four survivors, two pairs.
    for (uint64_t round = 1; round <= 3; ++round) {
        INFO("round " << round);
        const auto partners = choose_partners(survivors, round);
        for (size_t i = 0; i < survivors.size(); ++i) {
            REQUIRE(partners[i].has_value());
            REQUIRE(*partners[i] != victim);
        }
    }
}

TEST_CASE("connections to a member that is dead and forgotten are closed") {
    PeerConfig base = local_cluster_config();
    base.membership.retention = std::chrono::milliseconds(500);
    LocalCluster cluster(4, base);
    const auto nodes = nodes_of(cluster);
    wait_for("one view", 20000ms, [&] { return all_see_all_alive(nodes); });
    PeerNode& observer = cluster.node(1);
    // Gossip and probes reach every other member within a few periods.
    wait_for("a connection to each member", 20000ms, [&] { return observer.open_channels() == 3; });
    const uint64_t victim = cluster.node(3).node_id();
    cluster.node(3).kill();
    wait_for("forgotten", 20000ms, [&] { return !state_seen(observer, victim).has_value(); });
    wait_for("its connection closed", 5000ms, [&] { return observer.open_channels() == 2; });
}

TEST_CASE("a graceful leave is seen by every member when leave() returns") {
    LocalCluster cluster(4);
    const auto nodes = nodes_of(cluster);
    wait_for("one view", 20000ms, [&] { return all_see_all_alive(nodes); });
    const uint64_t leaver = cluster.node(3).node_id();
    cluster.node(3).leave();
    for (int i = 0; i < 3; ++i) {
        REQUIRE(state_seen(cluster.node(i), leaver) == MemberState::Left);
        REQUIRE(cluster.node(i).pairable_ids().size() == 3);
    }
}

TEST_CASE("two groups started apart with one common seed merge into one swarm") {
    const std::string a0_address = "127.0.0.1:" + std::to_string(free_port());
    // Group B first: its founder's seeds name group A's founder, which is not up yet.
    PeerConfig b_config = local_cluster_config();
    b_config.seeds = {a0_address};
    LocalCluster group_b(1, b_config);
    PeerConfig b_member = local_cluster_config();
    b_member.seeds = {group_b.node(0).address()};
    for (int i = 0; i < 3; ++i) group_b.add(b_member);

    PeerConfig a_config = local_cluster_config();
    a_config.listen = a0_address;
    LocalCluster group_a(1, a_config);
    PeerConfig a_member = local_cluster_config();
    a_member.seeds = {a0_address};
    for (int i = 0; i < 3; ++i) group_a.add(a_member);
    std::vector<PeerNode*> everyone = nodes_of(group_a);
    for (PeerNode* n : nodes_of(group_b)) everyone.push_back(n);
    REQUIRE(everyone.size() == 8);
    const auto took = wait_for("one swarm", 20000ms, [&] { return all_see_all_alive(everyone); });
    WARN("two groups of 4 merged " << took.count() << " ms after the common seed came up");
}

TEST_CASE("a seed name for every member, this node included, joins the others and never itself") {
    // A Kubernetes headless service over a StatefulSet: one name, every pod's address (localhost
    // here, since loopback nodes refuse seeds on other machines).
    const std::vector<uint16_t> ports = {free_port(), free_port(), free_port()};
    std::vector<std::string> targets;
    for (uint16_t port : ports) targets.push_back("ipv4:127.0.0.1:" + std::to_string(port));
    std::array<std::atomic<int>, 3> lookups{};
    const auto node_config = [&](size_t i) {
        PeerConfig config = local_cluster_config();
        config.listen = "127.0.0.1:" + std::to_string(ports[i]);
        config.seeds = {"localhost:7700"};
        // The node's own address first, so it is met before any other.
        config.resolve_seed = [&, i](const std::string& seed) {
            REQUIRE(seed == "localhost:7700");
            ++lookups[i];
            std::vector<std::string> order = {targets[i]};
            for (size_t j = 0; j < targets.size(); ++j)
                if (j != i) order.push_back(targets[j]);
            return order;
        };
        return config;
    };
    // The first pod up finds only itself: it runs alone, retrying with backoff, not every tick.
    PeerNode first(node_config(0));
    first.start();
    lookups[0] = 0;
    std::this_thread::sleep_for(1500ms);
    REQUIRE(first.members().size() == 1);
    REQUIRE(lookups[0] <= 6);  // 100, 200, 400, 800 ms backoff; every 100 ms tick would be 15
    PeerNode second(node_config(1));
    second.start();
    PeerNode third(node_config(2));
    third.start();
    const std::vector<PeerNode*> nodes = {&first, &second, &third};
    const auto took = wait_for("one swarm", 20000ms, [&] { return all_see_all_alive(nodes); });
    WARN("three nodes seeded by one name for all of them converged in " << took.count() << " ms");
    // Joined, they ask the name again only at the backoff's ceiling (1 s here), not every tick.
    for (auto& count : lookups) count = 0;
    std::this_thread::sleep_for(2000ms);
    for (auto& count : lookups) REQUIRE(count <= 3);
}

TEST_CASE("a restarted node comes back under its id, through its cache of peers alone") {
    TempDir dir;
    LocalCluster cluster(3);
    PeerConfig config = local_cluster_config();
    config.data_dir = dir.path();
    config.seeds = {cluster.node(0).address()};
    auto node = std::make_unique<PeerNode>(config);
    node->start();
    const uint64_t id = node->node_id();
    std::vector<PeerNode*> nodes = nodes_of(cluster);
    nodes.push_back(node.get());
    wait_for("one view", 20000ms, [&] { return all_see_all_alive(nodes); });
    wait_for("peers.txt", 10000ms,
             [&] { return std::filesystem::exists(dir.path() / "peers.txt"); });
    node->kill();
    wait_for("declared dead", 20000ms,
             [&] { return state_seen(cluster.node(1), id) == MemberState::Dead; });

    config.seeds.clear();
    node = std::make_unique<PeerNode>(config);
    node->start();
    REQUIRE(node->node_id() == id);
    nodes.back() = node.get();
    wait_for("back alive", 20000ms, [&] { return all_see_all_alive(nodes); });
}

TEST_CASE("a second process with the same key refuses to start") {
    TempDir dir;
    LocalCluster cluster(2);
    PeerConfig config = local_cluster_config();
    config.data_dir = dir.path() / "a";
    config.seeds = {cluster.node(0).address()};
    PeerNode original(config);
    original.start();
    wait_for("joined", 20000ms,
             [&] { return state_seen(cluster.node(1), original.node_id()) == MemberState::Alive; });

    std::filesystem::create_directories(dir.path() / "b");
    std::filesystem::copy_file(dir.path() / "a" / "node.key", dir.path() / "b" / "node.key");
    config.data_dir = dir.path() / "b";
    PeerNode clone(config);
    REQUIRE(clone.node_id() == original.node_id());
    try {
        clone.start();
        FAIL("a clone of a live node started");
    } catch (const Error& e) {
        REQUIRE_THAT(e.what(),
                     Catch::Contains("already live") && Catch::Contains(original.address()));
    }
    REQUIRE(state_seen(cluster.node(0), original.node_id()) == MemberState::Alive);
}

TEST_CASE("a node with another model fingerprint is listed but never pairable") {
    LocalCluster cluster(3);
    PeerNode& stranger = add_foreign_model_node(cluster);
    const auto nodes = nodes_of(cluster);
    wait_for("listed", 20000ms, [&] { return all_see_all_alive(nodes); });
    for (int i = 0; i < 3; ++i) REQUIRE(cluster.node(i).pairable_ids().size() == 3);
    REQUIRE(stranger.pairable_ids() == std::vector<uint64_t>{stranger.node_id()});
}

TEST_CASE("a node with the wrong swarm secret cannot join") {
    LocalCluster cluster(2);
    PeerConfig config = local_cluster_config();
    config.swarm_secret = "not the secret";
    config.seeds = {cluster.node(0).address()};
    PeerNode& outsider = cluster.add(config);
    std::this_thread::sleep_for(500ms);
    REQUIRE_FALSE(state_seen(cluster.node(0), outsider.node_id()).has_value());
    REQUIRE_FALSE(state_seen(cluster.node(1), outsider.node_id()).has_value());
    REQUIRE(outsider.members().size() == 1);
}
