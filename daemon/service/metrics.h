// Prometheus /metrics for starlingd (prometheus-cpp's registry, served on [metrics].listen): rounds,
// loss, tokens/s, exchange bytes and latency, paired and solo rounds, peers by state, compression
// ratio and the distance to partners. docs/operator.md lists them with what to watch.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include "daemon/service/metrics_http.h"
#include "daemon/swarm/swarm_node.h"

namespace starling {

class NodeMetrics {
public:
    // Serves on `listen` (host:port); throws starling::Error naming it when it cannot bind.
    explicit NodeMetrics(const std::string& listen);
    ~NodeMetrics();

    void record_round(const SwarmRound& round, uint64_t next_round, int64_t inner_step, uint64_t weight_bytes);
    void set_position(uint64_t round, int64_t inner_step);
    void record_val_loss(double loss);
    void record_checkpoint(uint64_t round);
    void record_checkpoint_failure();
    void record_peers(const std::vector<Member>& members, uint64_t self);
    // The peer node's running totals of calls refused for a wrong swarm secret, either way.
    void record_auth_refusals(uint64_t refused_here, uint64_t refused_by_seeds);
    uint16_t port() const { return server_->port(); }

private:
    std::shared_ptr<prometheus::Registry> registry_;
    std::unique_ptr<MetricsHttpServer> server_;
    prometheus::Gauge *round_, *inner_step_, *train_loss_, *val_loss_, *tokens_per_second_, *compression_ratio_,
        *partner_distance_, *checkpoint_round_, *checkpoint_time_;
    prometheus::Counter *paired_, *solo_, *bytes_sent_, *bytes_received_, *checkpoint_failures_;
    prometheus::Histogram *exchange_seconds_, *pair_seconds_;
    prometheus::Gauge *alive_, *suspect_, *dead_, *left_;
    prometheus::Counter *refused_here_, *refused_by_seeds_;
};

}  // namespace starling
