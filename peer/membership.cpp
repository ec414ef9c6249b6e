#include "peer/membership.h"

#include "model/config.h"

#include <algorithm>
#include <tuple>

namespace starling {

const char* member_state_name(MemberState state) {
    switch (state) {
        case MemberState::Alive: return "alive";
        case MemberState::Suspect: return "suspect";
        case MemberState::Dead: return "dead";
        case MemberState::Left: return "left";
    }
    return "unknown";
}

namespace {

auto precedence(const Member& m) {
    return std::make_tuple(m.incarnation, static_cast<int>(m.state));
}

bool gone(MemberState state) { return state == MemberState::Dead || state == MemberState::Left; }

}  // namespace

std::string incompatibility(const Member& them, const Member& self) {
    if (them.swarm_id != self.swarm_id)
        return "is in swarm '" + them.swarm_id + "' (this node: '" + self.swarm_id + "')";
    if (them.protocol_version != self.protocol_version)
        return "speaks protocol " + std::to_string(them.protocol_version) +
               " (this node: " + std::to_string(self.protocol_version) + ")";
    if (!them.method.empty() && !self.method.empty() && them.method != self.method)
        return "runs method '" + them.method + "' (this node: '" + self.method + "')";
    if (them.fingerprint == self.fingerprint) return "";
    const std::string keys = signature_differences(them.model, self.model);
    return "runs another model (" +
           (keys.empty() ? "fingerprint " + them.fingerprint + ", this node's " + self.fingerprint
                         : keys) +
           ")";
}

MemberTable::MemberTable(Member self, MembershipLimits limits)
    : limits_(limits),
      fingerprint_(self.fingerprint),
      protocol_version_(self.protocol_version),
      swarm_id_(self.swarm_id),
      method_(self.method),
      self_(std::move(self)) {}

MemberTable::Merge MemberTable::merge(const Member& incoming, SteadyClock::time_point now) {
    MutexLock lock(mutex_);
    return merge_locked(incoming, now);
}

MemberTable::Merge MemberTable::merge_locked(const Member& incoming, SteadyClock::time_point now) {
    if (incoming.node_id == self_.node_id) {
        if (incoming.instance != self_.instance) {
            // Echoes of this node's previous run carry a lower incarnation; a higher one that is
            // not gone is another process holding the same key.
            const bool other_live =
                !gone(incoming.state) && incoming.incarnation > self_.incarnation;
            return other_live ? Merge::Duplicate : Merge::Ignored;
        }
        if (incoming.state != MemberState::Alive && self_.state != MemberState::Left &&
            incoming.incarnation >= self_.incarnation) {
            self_.incarnation = incoming.incarnation + 1;
            return Merge::Refuted;
        }
        return Merge::Ignored;
    }
    if (const auto tomb = tombstones_.find(incoming.node_id); tomb != tombstones_.end()) {
        if (incoming.incarnation <= tomb->second.first) return Merge::Ignored;
        tombstones_.erase(tomb);
    }
    const auto it = others_.find(incoming.node_id);
    if (it == others_.end()) {
        if (gone(incoming.state) || others_.size() + 1 >= limits_.max_members)
            return Merge::Ignored;
        Member added = incoming;
        added.since = now;
        others_.emplace(added.node_id, std::move(added));
        return Merge::Added;
    }
    Member& known = it->second;
    if (precedence(incoming) > precedence(known)) {
        const bool state_changed =
            incoming.state != known.state || incoming.incarnation != known.incarnation;
        const auto since = state_changed ? now : known.since;
        known = incoming;
        known.since = since;
        return Merge::Updated;
    }
    if (precedence(incoming) == precedence(known)) {
        if (incoming.round >= known.round && incoming.step_seconds > 0.0)
            known.step_seconds = incoming.step_seconds;
        known.round = std::max(known.round, incoming.round);
        known.paired_through = std::max(known.paired_through, incoming.paired_through);
        known.solo_through = std::max(known.solo_through, incoming.solo_through);
    }
    return Merge::Ignored;
}

void MemberTable::suspect(uint64_t node_id, SteadyClock::time_point now) {
    MutexLock lock(mutex_);
    const auto it = others_.find(node_id);
    if (it == others_.end() || it->second.state != MemberState::Alive) return;
    it->second.state = MemberState::Suspect;
    it->second.since = now;
}

std::vector<uint64_t> MemberTable::expire(SteadyClock::time_point now) {
    MutexLock lock(mutex_);
    std::vector<uint64_t> declared_dead;
    for (auto it = others_.begin(); it != others_.end();) {
        Member& m = it->second;
        if (m.state == MemberState::Suspect && now - m.since >= limits_.suspicion_timeout) {
            m.state = MemberState::Dead;
            m.since = now;
            declared_dead.push_back(m.node_id);
        }
        if (gone(m.state) && now - m.since >= limits_.retention) {
            tombstones_[m.node_id] = {m.incarnation, now};
            it = others_.erase(it);
        } else {
            ++it;
        }
    }
    // Tombstones outlive any digest still in flight by a wide margin, then go, so the table of
    // them stays bounded too.
    std::erase_if(tombstones_,
                  [&](const auto& t) { return now - t.second.second >= 10 * limits_.retention; });
    while (tombstones_.size() > limits_.max_members) {
        tombstones_.erase(std::min_element(
            tombstones_.begin(), tombstones_.end(),
            [](const auto& a, const auto& b) { return a.second.second < b.second.second; }));
    }
    return declared_dead;
}

void MemberTable::set_round(uint64_t round) {
    MutexLock lock(mutex_);
    self_.round = round;
}

void MemberTable::set_step_seconds(double seconds) {
    MutexLock lock(mutex_);
    self_.step_seconds = seconds;
}

void MemberTable::set_choice(uint64_t round, bool paired) {
    MutexLock lock(mutex_);
    uint64_t& through = paired ? self_.paired_through : self_.solo_through;
    through = std::max(through, round + 1);
}

void MemberTable::note_round(uint64_t node_id, uint64_t round) {
    MutexLock lock(mutex_);
    const auto it = others_.find(node_id);
    if (it != others_.end()) it->second.round = std::max(it->second.round, round);
}

void MemberTable::set_address(const std::string& address) {
    MutexLock lock(mutex_);
    self_.address = address;
}

void MemberTable::leave() {
    MutexLock lock(mutex_);
    self_.state = MemberState::Left;
}

Member MemberTable::self() const {
    MutexLock lock(mutex_);
    return self_;
}

std::optional<Member> MemberTable::find(uint64_t node_id) const {
    MutexLock lock(mutex_);
    if (node_id == self_.node_id) return self_;
    const auto it = others_.find(node_id);
    if (it == others_.end()) return std::nullopt;
    return it->second;
}

std::vector<Member> MemberTable::all() const {
    MutexLock lock(mutex_);
    std::vector<Member> members{self_};
    for (const auto& [id, m] : others_) members.push_back(m);
    return members;
}

std::vector<Member> MemberTable::reachable_others() const {
    MutexLock lock(mutex_);
    std::vector<Member> members;
    for (const auto& [id, m] : others_)
        if (!gone(m.state)) members.push_back(m);
    return members;
}

bool MemberTable::compatible(const Member& member) const {
    return member.fingerprint == fingerprint_ && member.protocol_version == protocol_version_ &&
           member.swarm_id == swarm_id_ &&
           (member.method.empty() || method_.empty() || member.method == method_);
}

std::vector<uint64_t> MemberTable::pairable_ids() const {
    MutexLock lock(mutex_);
    std::vector<uint64_t> ids;
    if (self_.state == MemberState::Alive) ids.push_back(self_.node_id);
    for (const auto& [id, m] : others_)
        if (m.state == MemberState::Alive && compatible(m)) ids.push_back(id);
    std::sort(ids.begin(), ids.end());
    return ids;
}

std::vector<double> MemberTable::pairable_step_seconds() const {
    MutexLock lock(mutex_);
    std::vector<double> seconds;
    if (self_.state == MemberState::Alive && self_.step_seconds > 0.0)
        seconds.push_back(self_.step_seconds);
    for (const auto& [id, m] : others_)
        if (m.state == MemberState::Alive && compatible(m) && m.step_seconds > 0.0)
            seconds.push_back(m.step_seconds);
    return seconds;
}

}  // namespace starling
