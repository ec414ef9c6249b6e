// N peer nodes in one process, each a real gRPC server on its own 127.0.0.1 port, with timings
// fast enough for tests (100 ms gossip). Node 0 starts first and is every other node's seed.
#pragma once

#include <memory>
#include <vector>

#include "peer/peer_node.h"

namespace starling {

// Fast timings on loopback: gossip every 100 ms, probes time out after 300 ms, suspicion 2 s,
// Pair calls 1 s, exchanges 3 s.
PeerConfig local_cluster_config();

class LocalCluster {
public:
    explicit LocalCluster(int nodes, PeerConfig base = local_cluster_config());

    PeerNode& node(size_t i) { return *nodes_.at(i); }
    size_t size() const { return nodes_.size(); }
    // Starts one more node from `config` (its seeds as given) and returns it.
    PeerNode& add(const PeerConfig& config);
    // The same, under an identity the caller holds (to sign as that node in a test).
    PeerNode& add(const PeerConfig& config, const NodeIdentity& identity);
    const PeerConfig& base() const { return base_; }

private:
    PeerNode& started(std::unique_ptr<PeerNode> node);

    PeerConfig base_;
    std::vector<std::unique_ptr<PeerNode>> nodes_;
};

}  // namespace starling
