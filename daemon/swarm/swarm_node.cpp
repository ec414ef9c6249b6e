#include "daemon/swarm/swarm_node.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <future>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "common/error.h"
#include "peer/round_pacing.h"
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

}  // namespace

std::string swarm_method(const SwarmConfig& config) {
    std::string method(outer_method_name(config.method));
    if (config.method != OuterMethod::NoLoCo) return method;
    method += " " + std::string(message_mode_name(config.exchange.mode));
    if (config.exchange.mode == MessageMode::Fused && config.exchange.update_sample > 0)
        method += ", update sample " + std::to_string(config.exchange.update_sample);
    return method;
}

void SwarmConfig::validate() const {
    EngineConfig::validate();
    if (method == OuterMethod::Ddp)
        throw Error(
            "swarm: method \"ddp\" averages gradients every step, which only the experiment "
            "simulates; a swarm runs noloco, diloco or local");
    if (!(round_seconds >= 0.0)) throw Error("swarm: [swarm].round_seconds must be at least 0");
    if (!(uneven_margin >= 0.0)) throw Error("swarm: [swarm].uneven_margin must be at least 0");
}

namespace {

RoundLinkWrapper& round_link_wrapper() {
    static RoundLinkWrapper wrapper;
    return wrapper;
}

}  // namespace

void set_round_link_wrapper(RoundLinkWrapper wrapper) { round_link_wrapper() = std::move(wrapper); }

SwarmNode::SwarmNode(const SwarmConfig& config)
    : config_(config), schedule_(config.train.lr_schedule()) {
    config_.validate();
    backend_ = make_backend({config_.train.device, config_.train.threads, config_.train.matmul});
    device_ = backend_.description;
    config_.peer.fingerprint = ParameterManifest(config_.train.model).fingerprint();
    config_.peer.model = model_signature(config_.train.model);
    config_.peer.method = swarm_method(config_);
    peer_ = std::make_unique<PeerNode>(config_.peer);
    replica_ = std::make_unique<Replica>(config_.train, 1, backend_, 0, peer_->node_id());
    member_round_ = std::make_unique<MemberRound>(config_, replica_->manifest());
    link_ = std::make_unique<PeerRoundLink>(*peer_);
    if (round_link_wrapper()) link_ = round_link_wrapper()(std::move(link_), config_, *replica_);
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
    peer_->rounds().advertise(round_);
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
    peer_->rounds().advertise(round_);
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
            member_round_->prepare(*replica_);
            outer_step(report, replica_->theta());
            replica_->restart_from_phi(config_.residual_in_weights());
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

SwarmView SwarmNode::view() const {
    SwarmView view;
    const std::vector<uint64_t> pairable = peer_->pairable_ids();
    for (Member& m : peer_->members()) {
        if (m.node_id == node_id()) {
            view.self = std::move(m);
            continue;
        }
        const uint64_t id = m.node_id;
        view.others.push_back({std::move(m),
                               std::find(pairable.begin(), pairable.end(), id) != pairable.end(),
                               peer_->round_trip_ms(id), peer_->rounds().score_of(id)});
    }
    view.quarantined = peer_->rounds().quarantined().size();
    view.failures = peer_->failures();
    view.reachability = peer_->reachability();
    view.anchored_members = peer_->anchored_members();
    view.membership_sent_bytes = peer_->membership_sent_bytes();
    view.relayed_bytes = peer_->relayed_bytes();
    view.relayed_exchanges = peer_->relayed_exchanges();
    view.exchanges_through_relay = peer_->exchanges_through_relay();
    view.hole_punches = peer_->rounds().hole_punches();
    view.failed_hole_punches = peer_->rounds().failed_hole_punches();
    view.punched_exchanges = peer_->rounds().punched_exchanges();
    view.local_health = peer_->local_health();
    return view;
}

double SwarmNode::round_budget() const {
    if (config_.round_seconds > 0.0) return config_.round_seconds;
    if (config_.method == OuterMethod::Local) return 0.0;
    return automatic_round_seconds(peer_->pairable_step_seconds(), config_.inner_steps,
                                   config_.uneven_margin, last_budget_ > 0.0);
}

int SwarmNode::phase_steps() const {
    return phase_steps_in(round_budget(), step_seconds_, config_.inner_steps);
}

void SwarmNode::finish_round(const SwarmRound& report, const SwarmCounters& next,
                             const LoaderState& next_data) {
    round_ = next.round;
    // Pairing advertises NoLoCo's round and publishing DiLoCo's; a local node says it here.
    if (config_.method == OuterMethod::Local) peer_->rounds().advertise(round_);
    publish_snapshot(next, next_data);
    log_round(report);
    if (round_listener_) round_listener_(report);
}

void SwarmNode::outer_step(SwarmRound& report, std::span<const float> theta) {
    static_cast<RoundOutcome&>(report) =
        member_round_->step(*link_, *replica_, round_, theta, report.tokens);
}

void SwarmNode::start_exchange(const SwarmRound& report) {
    const std::span<const float> theta = replica_->theta();
    theta_sent_.assign(theta.begin(), theta.end());
    member_round_->prepare(*replica_);
    // The next phase starts where this node's own values alone would step phi, and the
    // exchange's step lands as a rebase from there (engine/overlap.h).
    overlap_start_.resize(theta_sent_.size());
    solo_momentum_.resize(theta_sent_.size());
    member_round_->overlapped_start(*replica_, theta_sent_, overlap_start_, solo_momentum_);
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
    replica_->rebase_onto_phi(overlap_start_, config_.residual_in_weights());
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
        case OuterMethod::NoLoCo: {
            // How the partner's message was judged: its held-out score, or why it had none (a
            // claim of fewer tokens than this node's is not scored).
            std::string held_out;
            if (r.partner_held_out)
                held_out = fmt::format(" | held-out {:.3f} of own", *r.partner_held_out);
            else if (r.partner_distance && r.refused == 0)
                held_out =
                    fmt::format(" | held-out not scored (claims {} tokens)", r.partner_tokens);
            spdlog::info(
                "{} | partner {} | sent {} B, received {} B | pair {:.3f} s, exchange {:.3f} s{}{}{}",
                head, r.partner ? format_node_id(*r.partner) : std::string("none"), r.bytes_sent,
                r.bytes_received, r.pair_seconds, r.exchange_seconds, held_out, landed,
                r.failure.empty() ? "" : " | solo: " + r.failure);
            return;
        }
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
