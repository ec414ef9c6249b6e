#include "daemon/service/node_state.h"

#include <algorithm>
#include <fmt/format.h>

namespace starling {

namespace {

double seconds_between(std::chrono::steady_clock::time_point a,
                       std::chrono::steady_clock::time_point b) {
    return std::chrono::duration<double>(b - a).count();
}

}  // namespace

std::string_view node_phase_name(v1::NodePhase phase) {
    switch (phase) {
        case v1::NODE_PHASE_STARTING: return "starting";
        case v1::NODE_PHASE_JOINING: return "joining";
        case v1::NODE_PHASE_TRAINING: return "training";
        case v1::NODE_PHASE_EXCHANGING: return "exchanging";
        case v1::NODE_PHASE_WAITING: return "waiting";
        case v1::NODE_PHASE_DONE: return "done";
        case v1::NODE_PHASE_DRAINING: return "draining";
        default: return "unknown";
    }
}

NodeState::NodeState(v1::NodeStatus identity, NodeMetrics* metrics)
    : metrics_(metrics), status_(std::move(identity)) {
    status_.set_phase(v1::NODE_PHASE_STARTING);
    if (metrics_) metrics_->record_identity(status_);
}

void NodeState::set_phase(v1::NodePhase phase) {
    {
        const MutexLock lock(mutex_);
        status_.set_phase(phase);
    }
    if (metrics_) metrics_->set_phase(phase);
}

v1::NodePhase NodeState::phase() const {
    const MutexLock lock(mutex_);
    return status_.phase();
}

void NodeState::record_round(const SwarmRound& round, uint64_t next_round, int64_t inner_step,
                             uint64_t weight_bytes, Clock::time_point ended) {
    if (metrics_) metrics_->record_round(round, next_round, inner_step, weight_bytes);
    failures_.count(FailureReason::RefusedMessage, round.refused);
    const MutexLock lock(mutex_);
    recent_losses_.push_back(round.train_loss);
    if (recent_losses_.size() > kRecentRounds) recent_losses_.pop_front();
    if (last_end_ && inner_step >= last_end_->second) {
        paces_.emplace_back(seconds_between(last_end_->first, ended),
                            inner_step - last_end_->second);
        if (paces_.size() > kPaceRounds) paces_.pop_front();
    }
    last_end_.emplace(ended, inner_step);
    status_.set_round(next_round);
    status_.set_inner_step(static_cast<uint64_t>(inner_step));
    status_.set_train_loss(round.train_loss);
    status_.set_train_seconds(status_.train_seconds() + round.inner_seconds);
    if (round.inner_seconds > 0.0)
        status_.set_tokens_per_second(static_cast<double>(round.tokens) / round.inner_seconds);
    status_.set_last_partner(round.partner && !round.solo ? format_node_id(*round.partner) : "");
    status_.set_last_failure(round.failure);
    status_.set_last_quorum(static_cast<uint32_t>(round.quorum));
    if (round.solo) {
        status_.set_rounds_solo(status_.rounds_solo() + 1);
    } else {
        status_.set_rounds_paired(status_.rounds_paired() + 1);
    }
    if (round.partner && !round.solo) {
        Exchanges& e = exchanges_[*round.partner];
        e.count++;
        e.last = Clock::now();
    }
    status_.set_bytes_sent(status_.bytes_sent() + round.bytes_sent);
    status_.set_bytes_received(status_.bytes_received() + round.bytes_received);
    if (round.bytes_sent > 0)
        status_.set_compression_ratio(static_cast<double>(weight_bytes) /
                                      static_cast<double>(round.bytes_sent));
    if (round.partner || round.quorum > 1)
        status_.set_last_exchange_seconds(round.exchange_seconds);
    if (round.partner_distance) status_.set_partner_distance(*round.partner_distance);
}

void NodeState::set_position(uint64_t round, int64_t inner_step, Clock::time_point now) {
    if (metrics_) metrics_->set_position(round, inner_step);
    const MutexLock lock(mutex_);
    status_.set_round(round);
    status_.set_inner_step(static_cast<uint64_t>(inner_step));
    last_end_.emplace(now, inner_step);
}

void NodeState::record_val_loss(double loss) {
    if (metrics_) metrics_->record_val_loss(loss);
    const MutexLock lock(mutex_);
    status_.set_val_loss(loss);
}

void NodeState::record_checkpoint(uint64_t round) {
    if (metrics_) metrics_->record_checkpoint(round);
    const MutexLock lock(mutex_);
    status_.set_checkpoint_round(round);
    checkpointed_ = Clock::now();
    checkpoint_failure_.clear();
}

void NodeState::record_checkpoint_failure(const std::string& why) {
    failures_.count(FailureReason::Checkpoint);
    const MutexLock lock(mutex_);
    checkpoint_failure_ = why;
}

FailureCounts NodeState::failures(const FailureCounts& peer_layer) const {
    FailureCounts totals = failures_.totals();
    for (size_t i = 0; i < totals.size(); i++) totals[i] += peer_layer[i];
    return totals;
}

void NodeState::forget_departed(const SwarmView& swarm) {
    const MutexLock lock(mutex_);
    std::erase_if(exchanges_, [&](const auto& entry) {
        return std::none_of(swarm.others.begin(), swarm.others.end(),
                            [&](const KnownPeer& p) { return p.member.node_id == entry.first; });
    });
}

v1::NodeStatus NodeState::recorded(Clock::time_point now) const {
    const MutexLock lock(mutex_);
    v1::NodeStatus s = status_;
    s.set_uptime_seconds(seconds_between(started_, now));
    if (checkpointed_) s.set_checkpoint_age_seconds(seconds_between(*checkpointed_, now));
    if (!checkpoint_failure_.empty())
        s.set_last_failure(s.last_failure().empty()
                               ? checkpoint_failure_
                               : s.last_failure() + "; " + checkpoint_failure_);
    for (double loss : recent_losses_) s.add_recent_train_losses(loss);
    double seconds = 0.0;
    int64_t steps = 0;
    for (const auto& [interval_seconds, interval_steps] : paces_) {
        seconds += interval_seconds;
        steps += interval_steps;
    }
    if (steps > 0) {
        const double remaining =
            static_cast<double>(s.total_steps()) - static_cast<double>(s.inner_step());
        s.set_eta_seconds(std::max(0.0, remaining) * seconds / static_cast<double>(steps));
    }
    return s;
}

v1::NodeStatus NodeState::status(const SwarmView& swarm) const {
    v1::NodeStatus s = recorded();
    uint32_t alive = 0, suspect = 0;
    for (const KnownPeer& p : swarm.others) {
        alive += p.member.state == MemberState::Alive;
        suspect += p.member.state == MemberState::Suspect;
    }
    s.set_peers_alive(alive);
    s.set_peers_suspect(suspect);
    s.set_reachability(reachability_name(swarm.reachability.state));
    s.set_reachability_detail(swarm.reachability.detail);
    for (const uint64_t anchor : swarm.self.anchors) s.add_anchors(format_node_id(anchor));
    s.set_anchored_members(static_cast<uint32_t>(swarm.anchored_members));
    s.set_relayed_exchanges(swarm.relayed_exchanges);
    s.set_exchanges_through_relay(swarm.exchanges_through_relay);
    s.set_hole_punches(swarm.hole_punches);
    s.set_failed_hole_punches(swarm.failed_hole_punches);
    s.set_punched_exchanges(swarm.punched_exchanges);
    return s;
}

v1::ListPeersResponse NodeState::peers(const SwarmView& swarm) const {
    v1::ListPeersResponse response;
    const auto now = Clock::now();
    const Member& self = swarm.self;
    const MutexLock lock(mutex_);
    for (const KnownPeer& peer : swarm.others) {
        const Member& m = peer.member;
        v1::PeerInfo* info = response.add_peers();
        info->set_node_id(format_node_id(m.node_id));
        info->set_address(m.address);
        info->set_state(member_state_name(m.state));
        info->set_round(m.round);
        info->set_compatible(m.fingerprint == self.fingerprint &&
                             m.protocol_version == self.protocol_version &&
                             m.swarm_id == self.swarm_id);
        if (peer.rtt_ms) info->set_rtt_ms(*peer.rtt_ms);
        info->set_reachability(reachability_name(m.reachability));
        for (const uint64_t anchor : m.anchors) info->add_anchors(format_node_id(anchor));
        if (peer.score) {
            info->set_refused_messages(peer.score->refused);
            if (peer.score->quarantined_until > self.round)
                info->set_quarantined_until_round(peer.score->quarantined_until);
        }
        if (auto it = exchanges_.find(m.node_id); it != exchanges_.end()) {
            info->set_exchanges(it->second.count);
            info->set_last_exchange_age_seconds(seconds_between(it->second.last, now));
        }
    }
    return response;
}

std::string NodeState::summary(const SwarmView& swarm) const {
    const v1::NodeStatus s = status(swarm);
    return fmt::format("round {} {} | loss {} | val {} | peers {} alive | paired {} solo {}",
                       s.round(), node_phase_name(s.phase()),
                       s.has_train_loss() ? fmt::format("{:.4f}", s.train_loss()) : "-",
                       s.has_val_loss() ? fmt::format("{:.4f}", s.val_loss()) : "-",
                       s.peers_alive(), s.rounds_paired(), s.rounds_solo());
}

}  // namespace starling
