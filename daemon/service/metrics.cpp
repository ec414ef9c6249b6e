#include "daemon/service/metrics.h"

#include <prometheus/text_serializer.h>

#include "daemon/service/node_state.h"
#include "daemon/service/process_metrics.h"

namespace starling {

namespace {

// A gauge family without a series yet: set_series() adds it with the first value.
prometheus::Family<prometheus::Gauge>* gauge_from_first_value(prometheus::Registry& registry,
                                                              const std::string& name,
                                                              const std::string& help) {
    return &prometheus::BuildGauge().Name(name).Help(help).Register(registry);
}

// Sets the family's one series, adding it with the first value. Add() hands back the series once
// it exists, under the family's own lock, so this is safe from any thread.
void set_series(prometheus::Family<prometheus::Gauge>& family, double value) {
    family.Add({}).Set(value);
}

prometheus::Counter* counter(prometheus::Registry& registry, const std::string& name,
                             const std::string& help) {
    return &prometheus::BuildCounter().Name(name).Help(help).Register(registry).Add({});
}

// Seconds from 10 ms to about 5 minutes: loopback exchanges to wide-area ones of large models.
prometheus::Histogram* seconds_histogram(prometheus::Registry& registry, const std::string& name,
                                         const std::string& help) {
    return &prometheus::BuildHistogram().Name(name).Help(help).Register(registry).Add(
        {}, prometheus::Histogram::BucketBoundaries{0.01, 0.03, 0.1, 0.3, 1, 3, 10, 30, 100, 300});
}

// Counters only go up: adds what a running total gained since the counter last followed it.
void follow(prometheus::Counter& counter, uint64_t total) {
    const double gained = static_cast<double>(total) - counter.Value();
    if (gained > 0) counter.Increment(gained);
}

}  // namespace

NodeMetrics::NodeMetrics(const std::string& listen)
    : registry_(std::make_shared<prometheus::Registry>()) {
    prometheus::Registry& r = *registry_;
    build_info_ =
        &prometheus::BuildGauge()
             .Name("starling_build_info")
             .Help(
                 "Always 1; the labels name the release, the model fingerprint, the node id and the swarm")
             .Register(r);
    auto& phases = prometheus::BuildGauge()
                       .Name("starling_phase")
                       .Help("1 for the phase the node is in, 0 for the others")
                       .Register(r);
    for (int p = v1::NodePhase_MIN; p <= v1::NodePhase_MAX; p++) {
        const auto phase = static_cast<v1::NodePhase>(p);
        if (v1::NodePhase_IsValid(p) && phase != v1::NODE_PHASE_UNSPECIFIED)
            phases_[phase] = &phases.Add({{"phase", std::string(node_phase_name(phase))}});
    }
    set_phase(v1::NODE_PHASE_STARTING);
    round_ = gauge_from_first_value(r, "starling_round", "The outer round in progress");
    inner_step_ = gauge_from_first_value(
        r, "starling_inner_step", "Inner steps taken: the learning-rate schedule's position");
    steps_target_ = gauge_from_first_value(r, "starling_train_steps_target",
                                           "Inner steps the schedule takes in all ([train].steps)");
    train_loss_ =
        gauge_from_first_value(r, "starling_train_loss",
                               "Mean training loss of the last round's inner steps (nats/token)");
    val_loss_ = gauge_from_first_value(
        r, "starling_val_loss", "Validation loss of phi at the last evaluation (nats/token)");
    tokens_per_second_ = gauge_from_first_value(
        r, "starling_tokens_per_second", "Training tokens per second in the last inner phase");
    train_tokens_ = counter(r, "starling_train_tokens_total", "Tokens trained on in inner steps");
    train_seconds_ = counter(r, "starling_train_seconds_total",
                             "Seconds in inner steps: its rate is the compute utilization");
    compression_ratio_ =
        gauge_from_first_value(r, "starling_compression_ratio",
                               "fp32 bytes of the weights over bytes sent in the last exchange");
    partner_distance_ =
        gauge_from_first_value(r, "starling_partner_distance",
                               "RMS of own weights minus the partner's in the last paired round");
    checkpoint_round_ = gauge_from_first_value(r, "starling_checkpoint_round",
                                               "Round of the newest checkpoint written");
    checkpoint_time_ = gauge_from_first_value(r, "starling_checkpoint_timestamp_seconds",
                                              "Unix time of the newest checkpoint written");
    auto& rounds = prometheus::BuildCounter()
                       .Name("starling_rounds_total")
                       .Help("Rounds finished, by whether the outer step had a partner")
                       .Register(r);
    paired_ = &rounds.Add({{"outcome", "paired"}});
    solo_ = &rounds.Add({{"outcome", "solo"}});
    bytes_sent_ = counter(r, "starling_exchange_sent_bytes_total", "Exchange payload bytes sent");
    bytes_received_ =
        counter(r, "starling_exchange_received_bytes_total", "Exchange payload bytes received");
    auto& failures =
        prometheus::BuildCounter()
            .Name("starling_failures_total")
            .Help(
                "Failures by reason: auth, connection, timeout, refused_message, state_sync, checkpoint")
            .Register(r);
    for (FailureReason reason : kFailureReasons)
        failures_.push_back(&failures.Add({{"reason", std::string(failure_reason_name(reason))}}));
    control_connections_closed_ = counter(
        r, "starling_control_connections_closed_total",
        "Connections the Control port's gate closed: streams reset past its budget, broken HTTP/2, "
        "over its connection cap");
    membership_sent_bytes_ = counter(
        r, "starling_membership_sent_bytes_total",
        "Payload bytes of the membership calls made and answers given (Join, Ping, PingReq, Gossip, "
        "Leave), without gRPC's framing");
    relayed_bytes_ = counter(
        r, "starling_relayed_bytes_total",
        "Bytes this node carried for private members: their DiLoCo round messages taken in and "
        "served as their anchor, and their exchanges passed on as a relay");
    relayed_exchanges_ = counter(r, "starling_relayed_exchanges_total",
                                 "Exchanges between two private members this node relayed");
    exchanges_through_relay_ = counter(
        r, "starling_exchanges_through_relay_total",
        "This node's own exchanges that went through a relay (it and its partner both private)");
    hole_punches_ = counter(r, "starling_hole_punches_total",
                            "Direct connections punched to a private partner through both NATs");
    failed_hole_punches_ = counter(
        r, "starling_failed_hole_punches_total",
        "Hole punches to a private partner that did not connect (the exchange went through a relay)");
    punched_exchanges_ = counter(r, "starling_punched_exchanges_total",
                                 "This node's exchanges that ran over a punched connection");
    exchange_seconds_ =
        seconds_histogram(r, "starling_exchange_seconds", "Duration of exchanges with a partner");
    pair_seconds_ =
        seconds_histogram(r, "starling_pair_seconds", "Time spent choosing a round's partner");
    auto& peers = prometheus::BuildGauge()
                      .Name("starling_peers")
                      .Help("Other members this node knows, by state")
                      .Register(r);
    alive_ = &peers.Add({{"state", "alive"}});
    suspect_ = &peers.Add({{"state", "suspect"}});
    dead_ = &peers.Add({{"state", "dead"}});
    left_ = &peers.Add({{"state", "left"}});
    auto& reachability =
        prometheus::BuildGauge()
            .Name("starling_reachability")
            .Help(
                "1 for this node's reachability: public (members' dial-backs reached its announced "
                "address), private (they could not: behind NAT or a firewall) or unknown")
            .Register(r);
    for (Reachability state : {Reachability::Unknown, Reachability::Public, Reachability::Private})
        reachability_[state] = &reachability.Add({{"state", reachability_name(state)}});
    anchors_ = &prometheus::BuildGauge()
                    .Name("starling_anchors")
                    .Help(
                        "Members this private node holds a stream to, through which others probe "
                        "it (0 for a public node)")
                    .Register(r)
                    .Add({});
    local_health_ = &prometheus::BuildGauge()
                         .Name("starling_local_health")
                         .Help(
                             "Lifeguard's local health: 0 healthy, up to 8 while this node's own "
                             "probes fail and others suspect it; its probe timeouts are 1 + this "
                             "times as long")
                         .Register(r)
                         .Add({});
    anchored_members_ = &prometheus::BuildGauge()
                             .Name("starling_anchored_members")
                             .Help("Private members that hold a stream to this node, their anchor")
                             .Register(r)
                             .Add({});
    quarantined_ = &prometheus::BuildGauge()
                        .Name("starling_quarantined_peers")
                        .Help(
                            "Members this node does not pair with for now: their messages were "
                            "refused too often")
                        .Register(r)
                        .Add({});
    peer_rtt_ =
        &prometheus::BuildGauge()
             .Name("starling_peer_rtt_seconds")
             .Help("Round-trip time of the last direct probe of each live member, by its node id")
             .Register(r);
    // Last, once every metric exists: scrapes start as soon as the server listens. Declared
    // after the registry, the server goes before it, so no scrape outlives what it reads.
    server_ = std::make_unique<MetricsHttpServer>(listen, [this] { return scrape(); });
}

NodeMetrics::~NodeMetrics() = default;

std::string NodeMetrics::scrape() const {
    std::vector<prometheus::MetricFamily> families = registry_->Collect();
    for (prometheus::MetricFamily& f : process_metric_families()) families.push_back(std::move(f));
    return prometheus::TextSerializer().Serialize(families);
}

void NodeMetrics::record_identity(const v1::NodeStatus& identity) {
    build_info_
        ->Add({{"version", identity.version()},
               {"fingerprint", identity.model_fingerprint()},
               {"node", identity.node_id()},
               {"swarm", identity.swarm_id()}})
        .Set(1);
    set_series(*steps_target_, static_cast<double>(identity.total_steps()));
    set_position(identity.round(), static_cast<int64_t>(identity.inner_step()));
}

void NodeMetrics::set_phase(v1::NodePhase phase) {
    for (const auto& [p, g] : phases_) g->Set(p == phase ? 1.0 : 0.0);
}

void NodeMetrics::record_round(const SwarmRound& round, uint64_t next_round, int64_t inner_step,
                               uint64_t weight_bytes) {
    set_position(next_round, inner_step);
    set_series(*train_loss_, round.train_loss);
    if (round.inner_seconds > 0.0)
        set_series(*tokens_per_second_, static_cast<double>(round.tokens) / round.inner_seconds);
    train_tokens_->Increment(static_cast<double>(round.tokens));
    train_seconds_->Increment(round.inner_seconds);
    (round.solo ? solo_ : paired_)->Increment();
    bytes_sent_->Increment(static_cast<double>(round.bytes_sent));
    bytes_received_->Increment(static_cast<double>(round.bytes_received));
    pair_seconds_->Observe(round.pair_seconds);
    if (round.partner || round.quorum > 1) exchange_seconds_->Observe(round.exchange_seconds);
    if (round.bytes_sent > 0)
        set_series(*compression_ratio_,
                   static_cast<double>(weight_bytes) / static_cast<double>(round.bytes_sent));
    if (round.partner_distance) set_series(*partner_distance_, *round.partner_distance);
}

void NodeMetrics::set_position(uint64_t round, int64_t inner_step) {
    set_series(*round_, static_cast<double>(round));
    set_series(*inner_step_, static_cast<double>(inner_step));
}

void NodeMetrics::record_val_loss(double loss) { set_series(*val_loss_, loss); }

void NodeMetrics::record_checkpoint(uint64_t round) {
    set_series(*checkpoint_round_, static_cast<double>(round));
    checkpoint_time_->Add({}).SetToCurrentTime();  // as set_series() does
}

void NodeMetrics::record_failures(const FailureCounts& totals) {
    for (size_t i = 0; i < totals.size(); i++) follow(*failures_[i], totals[i]);
}

void NodeMetrics::record_control_connections_closed(uint64_t total) {
    follow(*control_connections_closed_, total);
}

void NodeMetrics::record_peers(const SwarmView& swarm) {
    double counts[5] = {};
    std::map<uint64_t, prometheus::Gauge*> live;
    const MutexLock lock(rtt_mutex_);
    for (const KnownPeer& peer : swarm.others) {
        const Member& m = peer.member;
        counts[static_cast<int>(m.state)]++;
        if (m.state != MemberState::Alive && m.state != MemberState::Suspect) continue;
        const std::optional<double> rtt_ms = peer.rtt_ms;
        if (!rtt_ms) continue;
        const auto known = rtt_by_peer_.extract(m.node_id);
        prometheus::Gauge* series =
            known ? known.mapped() : &peer_rtt_->Add({{"peer", format_node_id(m.node_id)}});
        series->Set(*rtt_ms / 1000.0);
        live.emplace(m.node_id, series);
    }
    for (const auto& [id, series] : rtt_by_peer_) peer_rtt_->Remove(series);
    rtt_by_peer_ = std::move(live);
    alive_->Set(counts[static_cast<int>(MemberState::Alive)]);
    suspect_->Set(counts[static_cast<int>(MemberState::Suspect)]);
    dead_->Set(counts[static_cast<int>(MemberState::Dead)]);
    left_->Set(counts[static_cast<int>(MemberState::Left)]);
    quarantined_->Set(static_cast<double>(swarm.quarantined));
    anchors_->Set(static_cast<double>(swarm.self.anchors.size()));
    anchored_members_->Set(static_cast<double>(swarm.anchored_members));
    local_health_->Set(static_cast<double>(swarm.local_health));
    follow(*membership_sent_bytes_, swarm.membership_sent_bytes);
    follow(*relayed_bytes_, swarm.relayed_bytes);
    follow(*relayed_exchanges_, swarm.relayed_exchanges);
    follow(*exchanges_through_relay_, swarm.exchanges_through_relay);
    follow(*hole_punches_, swarm.hole_punches);
    follow(*failed_hole_punches_, swarm.failed_hole_punches);
    follow(*punched_exchanges_, swarm.punched_exchanges);
    for (const auto& [state, series] : reachability_)
        series->Set(state == swarm.reachability.state ? 1.0 : 0.0);
}

}  // namespace starling
