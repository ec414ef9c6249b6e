// Prometheus /metrics for starlingd (prometheus-cpp's registry, served on [metrics].listen): what
// the node is (build info), where it is (phase, round, inner step of how many), how it learns
// (losses, tokens), how it exchanges (bytes, latency, paired and solo rounds, compression, distance
// to partners), the swarm it sees (peers by state, round-trip time per peer), what failed by
// reason, and the standard process_* figures. docs/operator.md lists them with what to watch.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include "common/mutex.h"
#include "daemon/service/metrics_http.h"
#include "daemon/swarm/swarm_node.h"
#include "starling/v1/control.pb.h"

namespace starling {

class NodeMetrics {
public:
    // Serves on `listen` (host:port); throws starling::Error naming it when it cannot bind.
    explicit NodeMetrics(const std::string& listen);
    ~NodeMetrics();

    // The fixed facts NodeState starts from (node id, swarm, release, model fingerprint, the
    // schedule's length) and the position the node starts at.
    void record_identity(const v1::NodeStatus& identity);
    void set_phase(v1::NodePhase phase);
    void record_round(const SwarmRound& round, uint64_t next_round, int64_t inner_step,
                      uint64_t weight_bytes);
    void set_position(uint64_t round, int64_t inner_step);
    void record_val_loss(double loss);
    void record_checkpoint(uint64_t round);
    // Members by state, and the round-trip time of each live one; a member that died, left or
    // was forgotten loses its series, so their number stays the swarm's size.
    void record_peers(const SwarmView& swarm);
    // The node's running totals of failures by reason (NodeState::failures).
    void record_failures(const FailureCounts& totals);
    // The running total of connections the Control port's gate closed (ControlServer).
    void record_control_connections_closed(uint64_t total);
    uint16_t port() const { return server_->port(); }
    // What a scrape of /metrics gets: every family above and the process_* ones, as text.
    std::string scrape() const;

private:
    std::shared_ptr<prometheus::Registry> registry_;
    std::unique_ptr<MetricsHttpServer> server_;
    // Figures that mean nothing before their first value (the position before the node has
    // loaded its state, no round, evaluation, exchange or checkpoint yet): their families get a
    // series only with that value, so /metrics leaves them out until then instead of showing 0,
    // which rules and dashboards would take for a reading.
    using GaugeFamily = prometheus::Family<prometheus::Gauge>;
    GaugeFamily *round_, *inner_step_, *steps_target_, *train_loss_, *val_loss_,
        *tokens_per_second_, *compression_ratio_, *partner_distance_, *checkpoint_round_,
        *checkpoint_time_;
    prometheus::Counter *paired_, *solo_, *bytes_sent_, *bytes_received_, *train_tokens_,
        *train_seconds_, *control_connections_closed_, *membership_sent_bytes_, *relayed_bytes_,
        *relayed_exchanges_, *exchanges_through_relay_, *hole_punches_, *failed_hole_punches_,
        *punched_exchanges_;
    prometheus::Histogram *exchange_seconds_, *pair_seconds_;
    prometheus::Gauge *alive_, *suspect_, *dead_, *left_, *quarantined_, *anchors_,
        *anchored_members_, *local_health_;
    std::map<Reachability, prometheus::Gauge*> reachability_;
    prometheus::Family<prometheus::Gauge>* build_info_;
    std::map<v1::NodePhase, prometheus::Gauge*> phases_;
    std::vector<prometheus::Counter*> failures_;  // indexed as kFailureReasons
    prometheus::Family<prometheus::Gauge>* peer_rtt_;
    Mutex rtt_mutex_;
    std::map<uint64_t, prometheus::Gauge*> rtt_by_peer_ ABSL_GUARDED_BY(rtt_mutex_);
};

}  // namespace starling
