#include "peer/membership.h"

#include "model/config.h"

#include <algorithm>
#include <cmath>
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
        if (incoming.incarnation > tomb->second.first) {
            tombstones_.erase(tomb);
        } else if (gone(incoming.state) || others_.size() + 1 >= limits_.max_members) {
            return Merge::Ignored;
        } else {
            // Someone lists as alive a member this node saw go at that incarnation: a straggler's
            // stale news, or the other side of a partition that outlasted the retention. Listed
            // dead again, it goes out in this node's gossip, which puts the stale news down and,
            // where the member lives, reaches it so that it refutes; left out, the two sides of a
            // long partition would ignore each other for good (sim/, docs/scale.md).
            Member dead = incoming;
            dead.incarnation = tomb->second.first;
            dead.state = MemberState::Dead;
            dead.since = now;
            tombstones_.erase(tomb);
            index_.emplace(dead.node_id, others_.size());
            others_.push_back(std::move(dead));
            track_locked(others_.back());
            return Merge::Updated;
        }
    }
    Member* known = find_locked(incoming.node_id);
    if (!known) {
        if (gone(incoming.state) || others_.size() + 1 >= limits_.max_members)
            return Merge::Ignored;
        index_.emplace(incoming.node_id, others_.size());
        others_.push_back(incoming);
        others_.back().since = now;
        track_locked(others_.back());
        return Merge::Added;
    }
    if (precedence(incoming) > precedence(*known)) {
        const bool state_changed =
            incoming.state != known->state || incoming.incarnation != known->incarnation;
        const auto since = state_changed ? now : known->since;
        *known = incoming;
        known->since = since;
        track_locked(*known);
        return Merge::Updated;
    }
    if (precedence(incoming) == precedence(*known)) {
        if (incoming.round >= known->round && incoming.step_seconds > 0.0)
            known->step_seconds = incoming.step_seconds;
        known->round = std::max(known->round, incoming.round);
        known->paired_through = std::max(known->paired_through, incoming.paired_through);
        known->solo_through = std::max(known->solo_through, incoming.solo_through);
    }
    return Merge::Ignored;
}

Member* MemberTable::find_locked(uint64_t node_id) {
    const auto it = index_.find(node_id);
    return it == index_.end() ? nullptr : &others_[it->second];
}

void MemberTable::track_locked(const Member& member) {
    if (member.state == MemberState::Alive)
        timed_.erase(member.node_id);
    else
        timed_.insert(member.node_id);
}

void MemberTable::erase_locked(uint64_t node_id) {
    const auto it = index_.find(node_id);
    const size_t place = it->second;
    index_.erase(it);
    timed_.erase(node_id);
    if (place + 1 != others_.size()) {
        others_[place] = std::move(others_.back());
        index_[others_[place].node_id] = place;
    }
    others_.pop_back();
}

void MemberTable::suspect(uint64_t node_id, SteadyClock::time_point now) {
    MutexLock lock(mutex_);
    Member* member = find_locked(node_id);
    if (!member || member->state != MemberState::Alive) return;
    member->state = MemberState::Suspect;
    member->since = now;
    track_locked(*member);
}

std::vector<uint64_t> MemberTable::expire(SteadyClock::time_point now) {
    MutexLock lock(mutex_);
    std::vector<uint64_t> declared_dead, purged;
    const auto suspicion = suspicion_timeout_locked();
    for (const uint64_t id : timed_) {
        Member& m = *find_locked(id);
        if (m.state == MemberState::Suspect && now - m.since >= suspicion) {
            m.state = MemberState::Dead;
            m.since = now;
            declared_dead.push_back(m.node_id);
        }
        if (gone(m.state) && now - m.since >= limits_.retention) {
            tombstones_[m.node_id] = {m.incarnation, now};
            purged.push_back(id);
        }
    }
    for (const uint64_t id : purged) erase_locked(id);
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

SteadyClock::duration MemberTable::suspicion_timeout() const {
    MutexLock lock(mutex_);
    return suspicion_timeout_locked();
}

SteadyClock::duration MemberTable::suspicion_timeout_locked() const {
    const double decades = std::log10(static_cast<double>(others_.size() + 1));
    return std::chrono::duration_cast<SteadyClock::duration>(limits_.suspicion_timeout *
                                                             std::max(1.0, decades));
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
    if (Member* member = find_locked(node_id)) member->round = std::max(member->round, round);
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
    const auto it = index_.find(node_id);
    if (it == index_.end()) return std::nullopt;
    return others_[it->second];
}

std::vector<Member> MemberTable::all() const {
    MutexLock lock(mutex_);
    std::vector<Member> members{self_};
    members.insert(members.end(), others_.begin(), others_.end());
    return members;
}

std::vector<Member> MemberTable::reachable_others() const {
    MutexLock lock(mutex_);
    std::vector<Member> members;
    for (const Member& m : others_)
        if (!gone(m.state)) members.push_back(m);
    return members;
}

std::vector<Member> MemberTable::sample_reachable(size_t k, uint64_t excluded,
                                                  std::mt19937_64& rng) const {
    MutexLock lock(mutex_);
    const auto usable = [&](const Member& m) { return !gone(m.state) && m.node_id != excluded; };
    std::vector<Member> chosen;
    if (k == 0 || others_.empty()) return chosen;
    // Draws with rejection while the table is large next to k; when that keeps missing (most
    // entries gone) or the table is small, a shuffle of every usable entry.
    if (others_.size() > 4 * k) {
        std::set<size_t> drawn;
        std::uniform_int_distribution<size_t> place(0, others_.size() - 1);
        for (size_t tries = 0; chosen.size() < k && tries < 8 * k; ++tries) {
            const size_t i = place(rng);
            if (usable(others_[i]) && drawn.insert(i).second) chosen.push_back(others_[i]);
        }
        if (chosen.size() == k) return chosen;
        chosen.clear();
    }
    std::vector<size_t> candidates;
    for (size_t i = 0; i < others_.size(); i++)
        if (usable(others_[i])) candidates.push_back(i);
    std::shuffle(candidates.begin(), candidates.end(), rng);
    if (candidates.size() > k) candidates.resize(k);
    for (const size_t i : candidates) chosen.push_back(others_[i]);
    return chosen;
}

size_t MemberTable::others_count() const {
    MutexLock lock(mutex_);
    return others_.size();
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
    for (const Member& m : others_)
        if (m.state == MemberState::Alive && compatible(m)) ids.push_back(m.node_id);
    std::sort(ids.begin(), ids.end());
    return ids;
}

std::vector<double> MemberTable::pairable_step_seconds() const {
    MutexLock lock(mutex_);
    std::vector<double> seconds;
    if (self_.state == MemberState::Alive && self_.step_seconds > 0.0)
        seconds.push_back(self_.step_seconds);
    for (const Member& m : others_)
        if (m.state == MemberState::Alive && compatible(m) && m.step_seconds > 0.0)
            seconds.push_back(m.step_seconds);
    return seconds;
}

}  // namespace starling
