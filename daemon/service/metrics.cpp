#include "daemon/service/metrics.h"

#include <chrono>

#include <prometheus/text_serializer.h>

#include "common/error.h"

namespace starling {

namespace {

prometheus::Gauge* gauge(prometheus::Registry& registry, const std::string& name, const std::string& help,
                         const prometheus::Labels& labels = {}) {
    return &prometheus::BuildGauge().Name(name).Help(help).Register(registry).Add(labels);
}

prometheus::Counter* counter(prometheus::Registry& registry, const std::string& name, const std::string& help,
                             const prometheus::Labels& labels = {}) {
    return &prometheus::BuildCounter().Name(name).Help(help).Register(registry).Add(labels);
}

// Seconds from 10 ms to about 5 minutes: loopback exchanges to wide-area ones of large models.
prometheus::Histogram* seconds_histogram(prometheus::Registry& registry, const std::string& name,
                                         const std::string& help) {
    return &prometheus::BuildHistogram().Name(name).Help(help).Register(registry).Add(
        {}, prometheus::Histogram::BucketBoundaries{0.01, 0.03, 0.1, 0.3, 1, 3, 10, 30, 100, 300});
}

}  // namespace

NodeMetrics::NodeMetrics(const std::string& listen) : registry_(std::make_shared<prometheus::Registry>()) {
    prometheus::Registry& r = *registry_;
    round_ = gauge(r, "starling_round", "The outer round in progress");
    inner_step_ = gauge(r, "starling_inner_step", "Inner steps taken: the learning-rate schedule's position");
    train_loss_ = gauge(r, "starling_train_loss", "Mean training loss of the last round's inner steps (nats/token)");
    val_loss_ = gauge(r, "starling_val_loss", "Validation loss of phi at the last evaluation (nats/token)");
    tokens_per_second_ = gauge(r, "starling_tokens_per_second", "Training tokens per second in the last inner phase");
    compression_ratio_ =
        gauge(r, "starling_compression_ratio", "fp32 bytes of the weights over bytes sent in the last exchange");
    partner_distance_ = gauge(r, "starling_partner_distance",
                              "RMS of own weights minus the partner's in the last paired round");
    checkpoint_round_ = gauge(r, "starling_checkpoint_round", "Round of the newest checkpoint written");
    checkpoint_time_ = gauge(r, "starling_checkpoint_timestamp_seconds", "Unix time of the newest checkpoint written");
    auto& rounds = prometheus::BuildCounter()
                       .Name("starling_rounds_total")
                       .Help("Rounds finished, by whether the outer step had a partner")
                       .Register(r);
    paired_ = &rounds.Add({{"outcome", "paired"}});
    auto& refusals = prometheus::BuildCounter()
                         .Name("starling_wrong_secret_total")
                         .Help("Peer calls refused for a wrong swarm secret: others' refused here, or this node's "
                               "joins refused by a seed")
                         .Register(r);
    refused_here_ = &refusals.Add({{"direction", "refused_here"}});
    refused_by_seeds_ = &refusals.Add({{"direction", "refused_by_seed"}});
    solo_ = &rounds.Add({{"outcome", "solo"}});
    bytes_sent_ = counter(r, "starling_exchange_bytes_sent_total", "Exchange payload bytes sent");
    bytes_received_ = counter(r, "starling_exchange_bytes_received_total", "Exchange payload bytes received");
    checkpoint_failures_ = counter(r, "starling_checkpoint_failures_total",
                                   "Checkpoints that could not be written (a full disk, say)");
    exchange_seconds_ = seconds_histogram(r, "starling_exchange_seconds", "Duration of exchanges with a partner");
    pair_seconds_ = seconds_histogram(r, "starling_pair_seconds", "Time spent choosing a round's partner");
    auto& peers = prometheus::BuildGauge()
                      .Name("starling_peers")
                      .Help("Other members this node knows, by state")
                      .Register(r);
    alive_ = &peers.Add({{"state", "alive"}});
    suspect_ = &peers.Add({{"state", "suspect"}});
    dead_ = &peers.Add({{"state", "dead"}});
    left_ = &peers.Add({{"state", "left"}});
    // Last, once every metric exists: scrapes start as soon as the server listens.
    server_ = std::make_unique<MetricsHttpServer>(
        listen, [registry = registry_] { return prometheus::TextSerializer().Serialize(registry->Collect()); });
}

NodeMetrics::~NodeMetrics() = default;

void NodeMetrics::record_round(const SwarmRound& round, uint64_t next_round, int64_t inner_step,
                               uint64_t weight_bytes) {
    set_position(next_round, inner_step);
    train_loss_->Set(round.train_loss);
    if (round.inner_seconds > 0.0) tokens_per_second_->Set(static_cast<double>(round.tokens) / round.inner_seconds);
    (round.solo ? solo_ : paired_)->Increment();
    bytes_sent_->Increment(static_cast<double>(round.bytes_sent));
    bytes_received_->Increment(static_cast<double>(round.bytes_received));
    pair_seconds_->Observe(round.pair_seconds);
    if (round.partner || round.quorum > 1) exchange_seconds_->Observe(round.exchange_seconds);
    if (round.bytes_sent > 0)
        compression_ratio_->Set(static_cast<double>(weight_bytes) / static_cast<double>(round.bytes_sent));
    if (round.partner_distance) partner_distance_->Set(*round.partner_distance);
}

void NodeMetrics::set_position(uint64_t round, int64_t inner_step) {
    round_->Set(static_cast<double>(round));
    inner_step_->Set(static_cast<double>(inner_step));
}

void NodeMetrics::record_val_loss(double loss) { val_loss_->Set(loss); }

void NodeMetrics::record_checkpoint(uint64_t round) {
    checkpoint_round_->Set(static_cast<double>(round));
    checkpoint_time_->SetToCurrentTime();
}

void NodeMetrics::record_checkpoint_failure() {
    checkpoint_failures_->Increment();
}

void NodeMetrics::record_auth_refusals(uint64_t refused_here, uint64_t refused_by_seeds) {
    // Counters only go up: add what the totals gained since the last call.
    refused_here_->Increment(static_cast<double>(refused_here) - refused_here_->Value());
    refused_by_seeds_->Increment(static_cast<double>(refused_by_seeds) - refused_by_seeds_->Value());
}

void NodeMetrics::record_peers(const std::vector<Member>& members, uint64_t self) {
    double counts[5] = {};
    for (const Member& m : members)
        if (m.node_id != self) counts[static_cast<int>(m.state)]++;
    alive_->Set(counts[static_cast<int>(MemberState::Alive)]);
    suspect_->Set(counts[static_cast<int>(MemberState::Suspect)]);
    dead_->Set(counts[static_cast<int>(MemberState::Dead)]);
    left_->Set(counts[static_cast<int>(MemberState::Left)]);
}

}  // namespace starling
