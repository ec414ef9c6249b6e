#include "peer/swim.h"

#include <algorithm>
#include <bit>
#include <cmath>

namespace starling {

SwimCore::SwimCore(Member self, MembershipLimits limits, SwimSettings settings, uint64_t seed)
    : settings_(settings), table_(std::move(self), limits), rng_(seed) {}

SwimCore::Period SwimCore::tick(SteadyClock::time_point now) {
    Period period;
    period.declared_dead = table_.expire(now);
    MutexLock lock(mutex_);
    for (const uint64_t id : period.declared_dead) {
        spread(id);
        round_trips_.erase(id);  // a restart comes back over another path, maybe
    }
    if (probe_next_ >= probe_order_.size()) {
        probe_order_.clear();
        for (const Member& m : table_.reachable_others()) probe_order_.push_back(m.node_id);
        std::shuffle(probe_order_.begin(), probe_order_.end(), rng_);
        probe_next_ = 0;
    }
    if (probe_order_.empty()) return period;
    const auto verdict_pending = [&](const Member& m) {
        return m.state == MemberState::Alive && m.reachability == Reachability::Unknown &&
               now - m.since < settings_.unknown_grace;
    };
    const auto anchors_pending = [&](const Member& m) {
        return m.state == MemberState::Alive && m.reachability == Reachability::Private &&
               m.anchors.empty() && now - m.since < settings_.anchorless_grace;
    };
    if (auto target = table_.find(probe_order_[probe_next_++]);
        target && (target->state == MemberState::Alive || target->state == MemberState::Suspect) &&
        !verdict_pending(*target) && !anchors_pending(*target))
        period.probe = std::move(target);
    auto partner = sample_callable(1, table_.self().node_id);
    if (!partner.empty()) period.gossip = std::move(partner.front());
    return period;
}

bool SwimCore::direct_probe(const Member& target) const {
    if (callable(target)) return true;
    const uint64_t self = table_.self().node_id;
    return std::find(target.anchors.begin(), target.anchors.end(), self) != target.anchors.end();
}

std::vector<Member> SwimCore::indirect_helpers(uint64_t target) {
    const size_t k = static_cast<size_t>(std::max(settings_.indirect_probes, 0));
    const auto known = table_.find(target);
    if (known && !callable(*known)) {
        std::vector<Member> anchors;
        const uint64_t self = table_.self().node_id;
        for (const uint64_t id : known->anchors) {
            const auto anchor = id == self ? std::nullopt : table_.find(id);
            if (anchor &&
                (anchor->state == MemberState::Alive || anchor->state == MemberState::Suspect))
                anchors.push_back(*anchor);
        }
        return anchors;
    }
    MutexLock lock(mutex_);
    return sample_callable(k, target);
}

std::vector<Member> SwimCore::sample_callable(size_t k, uint64_t excluded) {
    std::vector<Member> chosen = table_.sample_reachable(k, excluded, rng_);
    std::erase_if(chosen, [](const Member& m) { return !callable(m); });
    const auto taken = [&](const Member& m) {
        return std::any_of(chosen.begin(), chosen.end(),
                           [&](const Member& c) { return c.node_id == m.node_id; });
    };
    // A few more draws fill the places private members took; when those miss too (callable
    // members are few), a pass over the whole table.
    for (int draw = 0; draw < 3 && chosen.size() < k; draw++)
        for (Member& m : table_.sample_reachable(k, excluded, rng_))
            if (chosen.size() < k && callable(m) && !taken(m)) chosen.push_back(std::move(m));
    if (chosen.size() < k) {
        std::vector<Member> rest = table_.reachable_others();
        std::erase_if(rest, [&](const Member& m) {
            return m.node_id == excluded || !callable(m) || taken(m);
        });
        std::shuffle(rest.begin(), rest.end(), rng_);
        for (Member& m : rest)
            if (chosen.size() < k) chosen.push_back(std::move(m));
    }
    return chosen;
}

bool SwimCore::probe_failed(uint64_t target, SteadyClock::time_point now) {
    count_against_local_health();
    const auto known = table_.find(target);
    if (!known || known->state != MemberState::Alive) return false;
    table_.suspect(target, now);
    MutexLock lock(mutex_);
    spread(target);
    return true;
}

MemberTable::Merge SwimCore::merge(const Member& incoming, SteadyClock::time_point now) {
    const auto result = table_.merge(incoming, now);
    if (result == MemberTable::Merge::Added || result == MemberTable::Merge::Updated) {
        MutexLock lock(mutex_);
        spread(incoming.node_id);
    }
    if (result == MemberTable::Merge::Refuted) count_against_local_health();
    return result;
}

void SwimCore::count_against_local_health() {
    MutexLock lock(mutex_);
    local_health_ = std::min(local_health_ + 1, kMaxLocalHealth);
}

void SwimCore::spread(uint64_t node_id) {
    const auto members = static_cast<uint64_t>(table_.others_count()) + 2;
    set_sends_left(node_id, settings_.retransmit_factor * std::bit_width(members - 1));
}

void SwimCore::set_sends_left(uint64_t node_id, int left) {
    const auto [it, added] = sends_left_.try_emplace(node_id, left);
    if (!added) {
        news_order_.erase({-it->second, node_id});
        it->second = left;
    }
    if (left > 0) {
        news_order_.emplace(-left, node_id);
    } else {
        sends_left_.erase(it);
    }
}

std::vector<Member> SwimCore::gossip_payload() {
    MutexLock lock(mutex_);
    if (table_.others_count() < settings_.full_view_max) {
        sends_left_.clear();  // every piece of news goes with the whole view
        news_order_.clear();
        return table_.all();
    }
    const size_t room = std::max<size_t>(settings_.digests_max, 1);
    std::vector<Member> payload;
    payload.reserve(room);
    payload.push_back(table_.self());
    // The freshest news first: most sends left, then the lower id. A member no longer listed
    // takes no room and its news ends.
    std::vector<std::pair<uint64_t, int>> taken;  // id, sends left after this one
    for (auto it = news_order_.begin(); it != news_order_.end() && payload.size() < room; ++it) {
        const auto [negative_left, id] = *it;
        auto member = table_.find(id);
        taken.emplace_back(id, member ? -negative_left - 1 : 0);
        if (member) payload.push_back(std::move(*member));
    }
    for (const auto& [id, left] : taken) set_sends_left(id, left);
    // Drawn at random to fill the rest: `room` of them, as the news already taken may be among.
    const size_t news_taken = payload.size();
    for (Member& m : table_.sample_reachable(room, payload.front().node_id, rng_)) {
        if (payload.size() == room) break;
        const bool sent = std::any_of(payload.begin(), payload.begin() + news_taken,
                                      [&](const Member& p) { return p.node_id == m.node_id; });
        if (!sent) payload.push_back(std::move(m));
    }
    return payload;
}

void SwimCore::acked(uint64_t member, SteadyClock::duration round_trip) {
    const double sample = std::chrono::duration<double, std::milli>(round_trip).count();
    MutexLock lock(mutex_);
    local_health_ = std::max(local_health_ - 1, 0);
    auto [it, first] = round_trips_.try_emplace(member);
    RoundTrip& rtt = it->second;
    if (first) {
        rtt = {sample, sample / 2};
        return;
    }
    // RFC 6298's gains: 1/4 for the variation, 1/8 for the mean.
    rtt.variation = 0.75 * rtt.variation + 0.25 * std::abs(rtt.smoothed - sample);
    rtt.smoothed = 0.875 * rtt.smoothed + 0.125 * sample;
}

std::chrono::milliseconds SwimCore::probe_timeout_for(uint64_t member,
                                                      std::chrono::milliseconds base) const {
    MutexLock lock(mutex_);
    const auto it = round_trips_.find(member);
    auto timeout = base;
    if (it != round_trips_.end()) {
        const double wanted = it->second.smoothed + 4 * it->second.variation;
        timeout = std::clamp(std::chrono::milliseconds(static_cast<int64_t>(std::ceil(wanted))),
                             base, base * kProbeTimeoutCeiling);
    }
    return timeout * (1 + local_health_);
}

int SwimCore::local_health() const {
    MutexLock lock(mutex_);
    return local_health_;
}

std::optional<double> SwimCore::round_trip_ms(uint64_t member) const {
    MutexLock lock(mutex_);
    const auto it = round_trips_.find(member);
    if (it == round_trips_.end()) return std::nullopt;
    return it->second.smoothed;
}

}  // namespace starling
