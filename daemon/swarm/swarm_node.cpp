#include "daemon/swarm/swarm_node.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <future>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "common/error.h"
#include "daemon/swarm/round_rule.h"
#include "daemon/swarm/snapshot_check.h"
#include "daemon/swarm/swarm_snapshot.h"
#include "codec/codec.h"
#include "engine/overlap.h"
#include "kernels/backend.h"
#include "kernels/cpu/cpu_ops.h"
#include "model/manifest.h"
#include "optimizer/outer_round.h"
#include "optimizer/sanity.h"

namespace starling {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
    return std::chrono::duration<double>(Clock::now() - start).count();
}

// A message's payload bytes before zstd: what an exchange moves at most, headers aside.
uint64_t planned_bytes(const codec::MessagePlan& plan) {
    uint64_t bytes = 0;
    for (const codec::Segment& s : plan.segments) bytes += codec::encoded_bytes(s.codec, s.numel);
    return bytes;
}

// RMS of a - b: how far two replicas have drifted apart.
double rms_distance(std::span<const float> a, std::span<const float> b) {
    double sum = 0.0;
    for (size_t i = 0; i < a.size(); i++) {
        const double d = static_cast<double>(a[i]) - static_cast<double>(b[i]);
        sum += d * d;
    }
    return a.empty() ? 0.0 : std::sqrt(sum / static_cast<double>(a.size()));
}

// Adds one reason to the round's failure text, which the round log line and status show.
void add_failure(SwarmRound& report, const std::string& why) {
    report.failure += (report.failure.empty() ? "" : "; ") + why;
}

}  // namespace

void SwarmConfig::validate() const {
    EngineConfig::validate();
    if (method == OuterMethod::Ddp)
        throw Error(
            "swarm: method \"ddp\" averages gradients every step, which only the experiment "
            "simulates; a swarm runs noloco, diloco or local");
    if (!(round_seconds >= 0.0)) throw Error("swarm: [swarm].round_seconds must be at least 0");
    if (!(uneven_margin >= 0.0)) throw Error("swarm: [swarm].uneven_margin must be at least 0");
}

SwarmNode::SwarmNode(const SwarmConfig& config)
    : config_(config), schedule_(config.train.lr_schedule()) {
    config_.validate();
    backend_ = make_backend({config_.train.device, config_.train.threads, config_.train.matmul});
    device_ = backend_.description;
    config_.peer.fingerprint = ParameterManifest(config_.train.model).fingerprint();
    config_.peer.model = model_signature(config_.train.model);
    peer_ = std::make_unique<PeerNode>(config_.peer);
    replica_ = std::make_unique<Replica>(config_.train, 1, backend_, 0, peer_->node_id());
    const bool split =
        config_.exchange.mode == MessageMode::Split && config_.method == OuterMethod::NoLoCo;
    plan_ = split || config_.method == OuterMethod::DiLoCo
                ? codec::make_plan(replica_->manifest(), codec::PlanKind::Delta,
                                   config_.exchange.delta_codec)
                : codec::make_plan(replica_->manifest(), codec::PlanKind::State,
                                   config_.exchange.state_codec);
    const size_t n = replica_->size();
    received_.resize(n);
    if (split) {
        phi_plan_ = codec::make_plan(replica_->manifest(), codec::PlanKind::State,
                                     config_.exchange.state_codec);
        received_phi_.resize(n);
    }
    scratch_a_.resize(n);
    scratch_b_.resize(n);
    peer_->start();
    publish_snapshot();
}

SwarmNode::~SwarmNode() = default;

SwarmCounters SwarmNode::adopt(std::span<const std::byte> bytes) {
    const size_t n = replica_->size();
    // Unpacked aside first: a snapshot refused halfway must leave this node's state as it was.
    std::vector<float> phi(n), momentum(n), adamw_m(n), adamw_v(n);
    const SwarmCounters counters = unpack_swarm_snapshot(bytes, {phi, momentum, adamw_m, adamw_v});
    Replica& r = *replica_;
    std::copy(phi.begin(), phi.end(), r.phi().begin());
    std::copy(momentum.begin(), momentum.end(), r.momentum().begin());
    r.set_adamw_moments(adamw_m, adamw_v);
    r.set_adamw_steps(static_cast<int64_t>(counters.adamw_steps));
    r.set_inner_step(static_cast<int64_t>(counters.inner_step));
    std::fill(r.residual().begin(), r.residual().end(), 0.0f);
    r.restart_from_phi();
    round_ = counters.round;
    // Advertise the round at once, so members already there can pair with this node.
    peer_->set_round(round_);
    publish_snapshot();
    return counters;
}

FetchResult SwarmNode::join_from_swarm(std::function<void()> on_chunk) {
    land_exchange();  // the exchange thread writes what the copy replaces
    std::vector<std::byte> bytes(swarm_snapshot_bytes(replica_->size()));
    FetchOptions options;
    options.call_timeout = config_.peer.state_sync_timeout;
    options.max_call_timeout = config_.peer.state_sync_timeout_max;
    options.min_rate_bytes_per_s = config_.peer.state_sync_min_link_bytes_per_s;
    if (on_chunk) options.progress = [&](uint32_t, uint32_t) { on_chunk(); };
    const double own_phi_norm = euclidean_distance(replica_->phi(), {});
    const auto remembered = [this](const SnapshotOffer& offer, std::optional<std::string> why) {
        if (why) refused_donors_.insert(offer.donors.begin(), offer.donors.end());
        return why;
    };
    options.refuse_offer = [&](const SnapshotOffer& offer, std::span<const SnapshotOffer> offers) {
        return remembered(offer, refuse_offered_snapshot(offer, offers, own_phi_norm));
    };
    options.refuse_snapshot = [&](const SnapshotOffer& offer, std::span<const std::byte> fetched) {
        return remembered(offer, refuse_fetched_snapshot(offer, fetched, replica_->size()));
    };
    options.refused_before = refused_donors_;
    FetchResult fetched =
        peer_->fetch_state({replica_->manifest().fingerprint(), bytes.size()}, bytes, options);
    const SwarmCounters counters = adopt(bytes);
    spdlog::info("swarm: node {} joined at round {} (inner step {}) from a snapshot of {} bytes",
                 format_node_id(node_id()), round_, counters.inner_step, bytes.size());
    return fetched;
}

void SwarmNode::skip_to_round(uint64_t round) {
    land_exchange();
    if (round <= round_) return;
    const int64_t skipped = static_cast<int64_t>(round - round_) * config_.inner_steps;
    replica_->set_inner_step(std::min(replica_->inner_step() + skipped, config_.train.steps));
    round_ = round;
    peer_->set_round(round_);
    publish_snapshot();
}

void SwarmNode::resume(std::span<const std::byte> snapshot, const LoaderState& data) {
    const LoaderState before = replica_->data().state();
    replica_->data().restore(data);
    try {
        adopt(snapshot);
    } catch (...) {
        replica_->data().restore(before);
        throw;
    }
    round_start_.data = data;
}

double SwarmNode::evaluate() {
    land_exchange();
    if (!evaluator_) evaluator_ = std::make_unique<Evaluator>(config_.train, backend_);
    return evaluator_->loss(replica_->phi());
}

SwarmRound SwarmNode::run_round(const std::atomic<bool>& stop) {
    // OpenMP's thread count belongs to the calling thread, and rounds may run on another thread
    // than the one that built the node.
    set_cpu_threads(config_.train.threads);
    SwarmRound report;
    std::optional<SwarmRound> landed;
    report.round = round_ + (in_flight_ ? 1 : 0);
    double loss_sum = 0.0;
    const double budget = round_budget();
    if (config_.round_seconds <= 0.0 && (budget > 0.0) != (last_budget_ > 0.0)) {
        if (budget > 0.0)
            spdlog::info(
                "swarm: members' step times differ by more than uneven_margin {}: rounds take "
                "{:.3f} s of training (H times the median step time)",
                config_.uneven_margin, budget);
        else
            spdlog::info(
                "swarm: members' step times are within half of uneven_margin {}: rounds "
                "take H = {} steps",
                config_.uneven_margin, config_.inner_steps);
    }
    last_budget_ = budget;
    const int64_t planned = phase_steps(), h = config_.inner_steps;
    int steps = 0;
    for (; steps < planned && !stop.load(); steps++) {
        set_phase(RoundPhase::Training);
        if (in_flight_ &&
            in_flight_->done.wait_for(std::chrono::seconds(0)) == std::future_status::ready)
            landed = land();
        // Step k of `planned` takes the learning rate at the phase's start + floor(k H / planned):
        // the round covers H schedule steps however many steps it takes.
        const auto schedule_steps =
            static_cast<int>((steps + 1) * h / planned - static_cast<int64_t>(steps) * h / planned);
        const auto start = Clock::now();
        loss_sum += replica_->inner_phase(1, schedule_, schedule_steps);
        report.inner_seconds += seconds_since(start);
        if (in_flight_) in_flight_->steps_since++;
    }
    report.steps = steps;
    report.tokens = static_cast<uint64_t>(steps) * static_cast<uint64_t>(config_.train.batch_size) *
                    static_cast<uint64_t>(config_.train.effective_seq_len());
    report.train_loss = steps > 0 ? loss_sum / steps : 0.0;
    if (steps < planned) {
        report.abandoned = true;
        report.landed = false;
        return report;
    }
    step_seconds_ = report.inner_seconds / steps;
    peer_->set_step_seconds(step_seconds_);
    if (config_.method == OuterMethod::Local || !config_.overlap) {
        if (config_.method == OuterMethod::Local) {
            replica_->adopt_theta();
        } else {
            set_phase(RoundPhase::Exchanging);
            prepare_messages();
            outer_step(report, replica_->theta());
            replica_->restart_from_phi();
        }
        finish_round(report, counters(round_ + 1), replica_->data().state());
        return report;
    }
    if (in_flight_) landed = land_exchange();
    start_exchange(report);
    if (landed) return *landed;
    report.landed = false;
    return report;
}

double SwarmNode::round_budget() const {
    if (config_.round_seconds > 0.0) return config_.round_seconds;
    if (config_.method == OuterMethod::Local) return 0.0;
    return automatic_round_seconds(peer_->pairable_step_seconds(), config_.inner_steps,
                                   config_.uneven_margin, last_budget_ > 0.0);
}

int SwarmNode::phase_steps() const {
    const double budget = round_budget();
    if (budget <= 0.0 || step_seconds_ <= 0.0) return config_.inner_steps;
    const double fits = std::round(budget / step_seconds_);
    return static_cast<int>(std::clamp(fits, 1.0, 16.0 * config_.inner_steps));
}

void SwarmNode::finish_round(const SwarmRound& report, const SwarmCounters& next,
                             const LoaderState& next_data) {
    round_ = next.round;
    // Pairing advertises NoLoCo's round and publishing DiLoCo's; a local node says it here.
    if (config_.method == OuterMethod::Local) peer_->set_round(round_);
    publish_snapshot(next, next_data);
    log_round(report);
    if (round_listener_) round_listener_(report);
}

void SwarmNode::prepare_messages() {
    if (config_.method == OuterMethod::DiLoCo || config_.exchange.mode == MessageMode::Split)
        replica_->compute_displacement();
}

void SwarmNode::outer_step(SwarmRound& report, std::span<const float> theta) {
    if (config_.method == OuterMethod::DiLoCo) {
        diloco_step(report);
    } else {
        noloco_step(report, theta);
    }
}

void SwarmNode::start_exchange(const SwarmRound& report) {
    const std::span<const float> theta = replica_->theta();
    theta_sent_.assign(theta.begin(), theta.end());
    prepare_messages();
    // The next phase starts where this node's own values alone would step phi, and the
    // exchange's step lands as a rebase from there (engine/overlap.h).
    overlap_start_.resize(theta_sent_.size());
    solo_momentum_.resize(theta_sent_.size());
    solo_outer_start(config_, *replica_, theta_sent_, overlap_start_, solo_momentum_, scratch_a_,
                     scratch_b_);
    replica_->restart_from(overlap_start_);
    // Built here and moved in: clang cannot default-construct a nested struct with member
    // initializers inside the enclosing class, where optional's traits first look at it.
    in_flight_.emplace(InFlight{});
    in_flight_->report = report;
    in_flight_->next = counters(round_ + 1);
    in_flight_->next_data = replica_->data().state();
    in_flight_->done = std::async(std::launch::async, [this] {
        // Beside the inner steps, which keep the cores: the codec and the outer step run serially.
        set_cpu_threads(1);
        const codec::SerialCoding serial;
        outer_step(in_flight_->report, theta_sent_);
    });
}

std::optional<SwarmRound> SwarmNode::land_exchange() {
    if (!in_flight_) return std::nullopt;
    set_phase(RoundPhase::Exchanging);
    return land();
}

SwarmRound SwarmNode::land() {
    const auto start = Clock::now();
    in_flight_->done.wait();  // the thread writes into *in_flight_ until then
    InFlight flight = std::move(*in_flight_);
    in_flight_.reset();
    flight.done.get();  // an exception of the exchange thread surfaces here
    SwarmRound report = std::move(flight.report);
    report.wait_seconds = seconds_since(start);
    report.overlap_steps = flight.steps_since;
    // The steps since the start, moved onto the new phi: exactly phi when there were none.
    replica_->rebase_onto_phi(overlap_start_);
    finish_round(report, flight.next, flight.next_data);
    return report;
}

void SwarmNode::log_round(const SwarmRound& r) const {
    const std::string head = fmt::format("swarm: node {} round {} | loss {:.4f}",
                                         format_node_id(node_id()), r.round, r.train_loss);
    const std::string landed =
        config_.overlap
            ? fmt::format(" | landed {} steps on, waited {:.3f} s", r.overlap_steps, r.wait_seconds)
            : "";
    switch (config_.method) {
        case OuterMethod::Local: spdlog::info("{} | local", head); return;
        case OuterMethod::Ddp: return;  // SwarmConfig::validate refuses it
        case OuterMethod::DiLoCo:
            spdlog::info("{} | quorum {} | sent {} B, received {} B | gather {:.3f} s{}{}", head,
                         r.quorum, r.bytes_sent, r.bytes_received, r.exchange_seconds, landed,
                         r.failure.empty() ? "" : " | left out: " + r.failure);
            return;
        case OuterMethod::NoLoCo:
            spdlog::info(
                "{} | partner {} | sent {} B, received {} B | pair {:.3f} s, exchange {:.3f} s{}{}",
                head, r.partner ? format_node_id(*r.partner) : std::string("none"), r.bytes_sent,
                r.bytes_received, r.pair_seconds, r.exchange_seconds, landed,
                r.failure.empty() ? "" : " | solo: " + r.failure);
            return;
    }
}

void SwarmNode::noloco_step(SwarmRound& report, std::span<const float> theta) {
    auto start = Clock::now();
    const std::optional<Member> partner = peer_->choose_partner(round_);
    report.pair_seconds = seconds_since(start);

    const bool split = config_.exchange.mode == MessageMode::Split;
    std::vector<MemberValues> partners;
    if (partner) {
        report.partner = partner->node_id;
        start = Clock::now();
        if (exchange_with(partner->node_id, theta, report)) {
            partners.push_back(
                {partner->node_id, received_,
                 split ? std::span<const float>(received_phi_) : std::span<const float>()});
            // Each side counts as the tokens it trained on, when both said them: equal counts give
            // the plain mean bit for bit.
            if (report.tokens > 0 && report.partner_tokens > 0)
                partners.back().weight = static_cast<double>(report.partner_tokens);
            // The partner's theta: as sent (fused), or phi + D (split), next to this node's.
            std::span<const float> theirs = received_;
            if (split) {
                for (size_t i = 0; i < received_.size(); i++)
                    scratch_a_[i] = received_phi_[i] + received_[i];
                theirs = scratch_a_;
            }
            report.partner_distance = rms_distance(theta, theirs);
        }
        report.exchange_seconds = seconds_since(start);
    }
    MemberValues own{node_id(), split ? replica_->displacement() : theta,
                     split ? std::span<const float>(replica_->phi()) : std::span<const float>()};
    if (!partners.empty() && report.partner_tokens > 0 && report.tokens > 0)
        own.weight = static_cast<double>(report.tokens);
    const NoLoCoStep step = noloco_outer_step(config_.outer, config_.exchange.mode, own, partners,
                                              replica_->partner_checks(), replica_->phi(),
                                              replica_->momentum(), scratch_a_, scratch_b_);
    report.solo = step.members < 2;
    for (const Refusal& refusal : step.refused) {
        add_failure(report, refusal.why);
        peer_->count_failure(FailureReason::RefusedMessage);
    }
    for (const MemberValues& p : partners) {
        const auto refusal = std::find_if(step.refused.begin(), step.refused.end(),
                                          [&](const Refusal& r) { return r.member == p.node_id; });
        peer_->judged(p.node_id, round_,
                      refusal == step.refused.end() ? std::nullopt
                                                    : std::optional<std::string>(refusal->why));
    }
}

bool SwarmNode::exchange_with(uint64_t partner, std::span<const float> theta, SwarmRound& report) {
    const bool split = config_.exchange.mode == MessageMode::Split;
    const ParameterManifest& manifest = replica_->manifest();
    // Both messages (split mode) share the link, and one deadline.
    const uint64_t bytes = planned_bytes(plan_) + (split ? planned_bytes(phi_plan_) : 0);
    const auto deadline = SteadyClock::now() + peer_->exchange_budget_with(partner, bytes);
    // Part 0: theta (fused), or D with error feedback when configured (split).
    float* residual =
        split && config_.exchange.error_feedback ? replica_->residual().data() : nullptr;
    codec::MessageEncoder first(plan_, {node_id(), round_, 0},
                                split ? replica_->displacement().data() : theta.data(), residual,
                                config_.exchange.zstd);
    codec::MessageDecoder first_in(manifest.fingerprint(), manifest, received_.data(),
                                   received_.size());
    std::future<ExchangeResult> second;
    std::optional<codec::MessageEncoder> phi_out;
    std::optional<codec::MessageDecoder> phi_in;
    if (split) {  // part 1, phi, on a stream of its own at the same time
        phi_out.emplace(phi_plan_, codec::RoundingKey{node_id(), round_, 1}, replica_->phi().data(),
                        nullptr, config_.exchange.zstd);
        phi_in.emplace(manifest.fingerprint(), manifest, received_phi_.data(),
                       received_phi_.size());
        second = std::async(std::launch::async, [&] {
            return peer_->exchange(
                {round_, partner, outgoing_message(*phi_out), *phi_in, deadline, 1, report.tokens});
        });
    }
    // The exchange checks that each message names the partner and this round.
    std::vector<ExchangeResult> results{peer_->exchange(
        {round_, partner, outgoing_message(first), first_in, deadline, 0, report.tokens})};
    if (split) results.push_back(second.get());
    bool received = true;
    for (const ExchangeResult& r : results) {
        report.bytes_sent += r.bytes_sent;
        report.bytes_received += r.bytes_received;
        report.partner_tokens = r.partner_tokens;
        if (!r.received) {
            received = false;
            add_failure(report, r.error);
        }
    }
    return received;
}

void SwarmNode::diloco_step(SwarmRound& report) {
    const auto start = Clock::now();
    float* residual = config_.exchange.error_feedback ? replica_->residual().data() : nullptr;
    codec::MessageEncoder encoder(plan_, {node_id(), round_, 0}, replica_->displacement().data(),
                                  residual, config_.exchange.zstd);
    const auto own = std::make_shared<const codec::EncodedMessage>(codec::encode_to_end(encoder));
    peer_->set_round(round_);
    peer_->round_messages().publish(round_, {own, report.tokens});

    // The quorum: every live member of this model and swarm, by node id. Gossiped rounds lag, so
    // they decide nothing here: a member still on an earlier round is waited for (up to T_xchg,
    // DiLoCo being synchronous), one that is past this round answers NOT_FOUND at once.
    std::vector<uint64_t> quorum = peer_->pairable_ids();
    std::sort(quorum.begin(), quorum.end());
    const ParameterManifest& manifest = replica_->manifest();
    gathered_.resize(quorum.size());
    std::vector<std::unique_ptr<codec::MessageDecoder>> decoders;
    for (auto& arena : gathered_) {
        arena.resize(replica_->size());
        decoders.push_back(std::make_unique<codec::MessageDecoder>(manifest.fingerprint(), manifest,
                                                                   arena.data(), arena.size()));
    }
    std::vector<uint64_t> others;
    std::vector<codec::MessageDecoder*> other_decoders;
    size_t own_index = 0;
    for (size_t i = 0; i < quorum.size(); i++) {
        if (quorum[i] == node_id()) {
            own_index = i;
            continue;
        }
        others.push_back(quorum[i]);
        other_decoders.push_back(decoders[i].get());
    }
    // Its own D as the others decode it, so every member averages the same values.
    codec::decode_to_end(own->header, own->chunks, *decoders[own_index]);
    const std::vector<PeerNode::Gathered> fetched =
        peer_->gather(round_, others, other_decoders, &report.bytes_received);

    // In node-id order, with the tokens each member said it trained on: the weights when every
    // member said them (equal counts give the plain mean bit for bit).
    std::vector<std::span<const float>> decoded;
    std::vector<double> weights;
    std::vector<uint64_t> authors;
    for (size_t i = 0, k = 0; i < quorum.size(); i++) {
        uint64_t tokens = report.tokens;
        if (i != own_index) {
            const PeerNode::Gathered& g = fetched[k++];
            if (!g.error.empty()) continue;
            tokens = g.tokens;
        }
        decoded.push_back(gathered_[i]);
        weights.push_back(static_cast<double>(tokens));
        authors.push_back(quorum[i]);
    }
    if (std::find(weights.begin(), weights.end(), 0.0) != weights.end()) weights.clear();
    for (const PeerNode::Gathered& g : fetched)
        if (!g.error.empty()) add_failure(report, g.error);
    report.bytes_sent = own->bytes() * others.size();
    report.quorum = decoded.size();
    report.solo = decoded.size() < 2;
    report.exchange_seconds = seconds_since(start);
    const DiLoCoStep step = diloco_outer_step(config_.outer, decoded, replica_->phi(),
                                              replica_->momentum(), scratch_a_, weights);
    for (const size_t k : step.not_finite) {
        add_failure(report,
                    fmt::format("member {:016x}: its D is not finite, left out", authors[k]));
        peer_->count_failure(FailureReason::RefusedMessage);
    }
}

std::vector<std::byte> SwarmNode::snapshot_bytes() const {
    std::vector<std::byte> bytes(swarm_snapshot_bytes(replica_->size()));
    pack_snapshot(bytes, counters(round_));
    return bytes;
}

SwarmCounters SwarmNode::counters(uint64_t round) const {
    return {round, static_cast<uint64_t>(replica_->inner_step()),
            static_cast<uint64_t>(replica_->adamw_steps())};
}

void SwarmNode::pack_snapshot(std::span<std::byte> out, const SwarmCounters& counters) const {
    pack_swarm_snapshot_into(out, counters, replica_->phi(), replica_->momentum(),
                             replica_->adamw_m_host(), replica_->adamw_v_host());
}

void SwarmNode::publish_snapshot(const SwarmCounters& counters, const LoaderState& data) {
    // A buffer no snapshot uses any more (one published a few rounds ago, dropped by the store and
    // by joiners) is refilled: packing gigabytes into fresh memory costs page faults every round.
    std::shared_ptr<std::vector<std::byte>> buffer;
    std::erase_if(snapshot_buffers_, [&](const std::shared_ptr<std::vector<std::byte>>& b) {
        if (b.use_count() != 1) return false;
        if (buffer) return true;  // one spare is enough
        buffer = b;
        return false;
    });
    if (!buffer) {
        buffer = std::make_shared<std::vector<std::byte>>(swarm_snapshot_bytes(replica_->size()));
        snapshot_buffers_.push_back(buffer);
    }
    pack_snapshot(*buffer, counters);
    round_start_.snapshot = std::make_shared<const Snapshot>(
        config_.peer.fingerprint, counters.round, swarm_snapshot_metadata(replica_->phi()),
        std::shared_ptr<const std::vector<std::byte>>(buffer));
    round_start_.data = data;
    peer_->snapshots().publish(round_start_.snapshot);
}

}  // namespace starling
