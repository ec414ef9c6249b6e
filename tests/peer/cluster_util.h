// Helpers for the cluster tests: real nodes converge in real time, so conditions are polled.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <grpcpp/create_channel.h>
#include <chrono>
#include <map>
#include <optional>
#include <thread>
#include <vector>

#include "peer/local_cluster.h"
#include "peer/tls.h"

namespace starling::test {

// A port on 127.0.0.1 free at the time of asking, for a node that must start later at a known
// address (or an address where nothing listens).
inline uint16_t free_port() {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
    socklen_t length = sizeof addr;
    getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &length);
    close(fd);
    return ntohs(addr.sin_port);
}

// A channel to a cluster node's peer port that gets through TLS (a holder of the secret), for
// tests that make calls a node never would.
inline std::shared_ptr<grpc::Channel> swarm_channel(const std::string& address) {
    return grpc::CreateChannel(address,
                               channel_credentials({}, local_cluster_config().swarm_secret));
}

// Polls `done` every 10 ms until it holds or `limit` passes; returns the time it took, or fails
// the test naming `what`.
template <typename Predicate>
std::chrono::milliseconds wait_for(const char* what, std::chrono::milliseconds limit,
                                   Predicate done) {
    const auto start = std::chrono::steady_clock::now();
    while (!done()) {
        const auto elapsed = std::chrono::steady_clock::now() - start;
        if (elapsed > limit) FAIL(what << ": not reached within " << limit.count() << " ms");
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() -
                                                                 start);
}

inline std::optional<MemberState> state_seen(const PeerNode& observer, uint64_t node_id) {
    for (const Member& m : observer.members())
        if (m.node_id == node_id) return m.state;
    return std::nullopt;
}

// Every node in `nodes` sees every other one ALIVE.
inline bool all_see_all_alive(const std::vector<PeerNode*>& nodes) {
    for (const PeerNode* observer : nodes)
        for (const PeerNode* other : nodes)
            if (state_seen(*observer, other->node_id()) != MemberState::Alive) return false;
    return true;
}

// Every node in `nodes` has the same pairable view, of exactly these nodes.
inline bool same_pairable_view(const std::vector<PeerNode*>& nodes) {
    for (const PeerNode* node : nodes)
        if (node->pairable_ids() != nodes.front()->pairable_ids()) return false;
    return nodes.front()->pairable_ids().size() == nodes.size();
}

// Each node's partner names it back, and no one is its own partner; returns how many are solo.
inline size_t require_mutual(const std::vector<PeerNode*>& nodes,
                             const std::vector<std::optional<uint64_t>>& partners) {
    std::map<uint64_t, std::optional<uint64_t>> by_id;
    for (size_t i = 0; i < nodes.size(); ++i) by_id[nodes[i]->node_id()] = partners[i];
    size_t solo = 0;
    for (const auto& [id, partner] : by_id) {
        if (!partner) {
            ++solo;
            continue;
        }
        INFO("node " << format_node_id(id) << " chose " << format_node_id(*partner));
        REQUIRE(*partner != id);
        REQUIRE(by_id.count(*partner) == 1);
        REQUIRE(by_id[*partner] == id);
    }
    return solo;
}

// choose_partner(round) on every node at once, one thread each, as nodes of a swarm do; the
// partners' ids in the order of `nodes`.
inline std::vector<std::optional<uint64_t>> choose_partners(const std::vector<PeerNode*>& nodes,
                                                            uint64_t round) {
    std::vector<std::optional<uint64_t>> partners(nodes.size());
    std::vector<std::thread> threads;
    for (size_t i = 0; i < nodes.size(); ++i) {
        threads.emplace_back([&, i] {
            if (const auto partner = nodes[i]->rounds().choose_partner(round))
                partners[i] = partner->node_id;
        });
    }
    for (auto& thread : threads) thread.join();
    return partners;
}

// One more node in `cluster`, joined through node 0, running another model.
inline PeerNode& add_foreign_model_node(LocalCluster& cluster) {
    PeerConfig config = cluster.base();
    config.fingerprint = "another model";
    config.seeds = {cluster.node(0).address()};
    return cluster.add(config);
}

// One more node in `cluster`, joined through node 0, announcing an address where nothing listens:
// members cannot dial it, so it learns it is private and holds anchors (peer/anchors.h).
inline PeerNode& add_private_node(LocalCluster& cluster,
                                  const NodeIdentity& identity = NodeIdentity::generate()) {
    PeerConfig config = cluster.base();
    config.seeds = {cluster.node(0).address()};
    config.announce = "127.0.0.1:" + std::to_string(free_port());
    return cluster.add(config, identity);
}

inline std::vector<PeerNode*> nodes_of(LocalCluster& cluster) {
    std::vector<PeerNode*> nodes;
    for (size_t i = 0; i < cluster.size(); ++i) nodes.push_back(&cluster.node(i));
    return nodes;
}

}  // namespace starling::test
