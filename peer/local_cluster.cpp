#include "peer/local_cluster.h"

namespace starling {

PeerConfig local_cluster_config() {
    PeerConfig config;
    config.listen = "127.0.0.1:0";
    config.swarm_id = "local";
    config.swarm_secret = "local cluster secret";
    config.fingerprint = "local";
    config.gossip_interval = std::chrono::milliseconds(100);
    config.probe_timeout = std::chrono::milliseconds(300);
    config.membership.suspicion_timeout = std::chrono::milliseconds(2000);
    config.membership.retention = std::chrono::milliseconds(30000);
    config.join_backoff_max = std::chrono::milliseconds(1000);
    config.pair_timeout = std::chrono::milliseconds(1000);
    config.exchange_timeout = std::chrono::milliseconds(3000);
    return config;
}

LocalCluster::LocalCluster(int nodes, PeerConfig base) : base_(std::move(base)) {
    for (int i = 0; i < nodes; ++i) {
        PeerConfig config = base_;
        if (i > 0) config.seeds = {nodes_.front()->address()};
        add(config);
    }
}

PeerNode& LocalCluster::add(const PeerConfig& config) {
    return started(std::make_unique<PeerNode>(config));
}

PeerNode& LocalCluster::add(const PeerConfig& config, const NodeIdentity& identity) {
    return started(std::make_unique<PeerNode>(config, identity));
}

PeerNode& LocalCluster::started(std::unique_ptr<PeerNode> node) {
    nodes_.push_back(std::move(node));
    nodes_.back()->start();
    return *nodes_.back();
}

}  // namespace starling
