#include "peer/membership.h"

#include "model/config.h"

#include <algorithm>
#include <cmath>
#include <tuple>
#include <unordered_map>

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

PairingFacts facts_of(uint64_t node_id, uint64_t round, uint64_t paired_through,
                      uint64_t solo_through, Reachability reachability, bool anchored,
                      SteadyClock::time_point heard) {
    const bool can_call = reachability != Reachability::Private;
    return {node_id, round, paired_through, solo_through, can_call, can_call || anchored, heard};
}

}  // namespace

bool callable(const Member& m) { return m.reachability != Reachability::Private; }

PairingFacts pairing_facts(const Member& m) {
    return facts_of(m.node_id, m.round, m.paired_through, m.solo_through, m.reachability,
                    !m.anchors.empty(), m.heard);
}

std::vector<PairingFacts> pairing_facts(const std::vector<Member>& members) {
    std::vector<PairingFacts> facts;
    facts.reserve(members.size());
    for (const Member& m : members) facts.push_back(pairing_facts(m));
    return facts;
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

Member MemberTable::member_of(const Entry& entry) {
    const Card& card = *entry.card;
    Member m;
    m.node_id = card.node_id;
    m.address = card.address;
    m.incarnation = entry.incarnation;
    m.state = entry.state;
    m.round = entry.round;
    m.paired_through = entry.paired_through;
    m.solo_through = entry.solo_through;
    m.step_seconds = entry.step_seconds;
    m.reachability = entry.reachability;
    m.anchors = entry.anchors;
    m.fingerprint = card.fingerprint;
    m.model = card.model;
    m.method = card.method;
    m.protocol_version = card.protocol_version;
    m.swarm_id = card.swarm_id;
    m.public_key = card.public_key;
    m.instance = card.instance;
    m.since = entry.since;
    m.heard = entry.heard;
    return m;
}

MemberTable::Entry MemberTable::entry_of(const Member& m, const std::shared_ptr<const Card>& card) {
    // Compared field by field first: most digests repeat what the table holds.
    const bool same = card && card->node_id == m.node_id && card->instance == m.instance &&
                      card->protocol_version == m.protocol_version && card->address == m.address &&
                      card->fingerprint == m.fingerprint && card->model == m.model &&
                      card->method == m.method && card->swarm_id == m.swarm_id &&
                      card->public_key == m.public_key;
    Entry entry;
    entry.card = same ? card
                      : card_for({m.node_id, m.instance, m.protocol_version, m.address,
                                  m.fingerprint, m.model, m.method, m.swarm_id, m.public_key});
    entry.incarnation = m.incarnation;
    entry.round = m.round;
    entry.paired_through = m.paired_through;
    entry.solo_through = m.solo_through;
    entry.step_seconds = m.step_seconds;
    entry.reachability = m.reachability;
    entry.anchors = m.anchors;
    entry.since = m.since;
    entry.state = m.state;
    return entry;
}

std::shared_ptr<const MemberTable::Card> MemberTable::card_for(Card card) {
    // Process-wide: one card per run of a member however many tables list it. Expired ones are
    // swept as the registry doubles, so it stays within twice the cards in use.
    static Mutex mutex;
    static std::unordered_map<uint64_t, std::weak_ptr<const Card>> cards;
    static size_t sweep_at = 1024;
    MutexLock lock(mutex);
    auto& slot = cards[card.node_id];
    if (auto shared = slot.lock(); shared && *shared == card) return shared;
    auto made = std::make_shared<const Card>(std::move(card));
    slot = made;
    if (cards.size() >= sweep_at) {
        std::erase_if(cards, [](const auto& entry) { return entry.second.expired(); });
        sweep_at = std::max<size_t>(1024, 2 * cards.size());
    }
    return made;
}

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
            Entry dead = entry_of(incoming, nullptr);
            dead.incarnation = tomb->second.first;
            dead.state = MemberState::Dead;
            dead.since = now;
            tombstones_.erase(tomb);
            insert_locked(std::move(dead));
            return Merge::Updated;
        }
    }
    Entry* known = find_locked(incoming.node_id);
    if (!known) {
        if (gone(incoming.state) || others_.size() + 1 >= limits_.max_members)
            return Merge::Ignored;
        Entry added = entry_of(incoming, nullptr);
        added.since = now;
        insert_locked(std::move(added));
        return Merge::Added;
    }
    const auto known_precedence =
        std::make_tuple(known->incarnation, static_cast<int>(known->state));
    if (precedence(incoming) > known_precedence) {
        const bool state_changed =
            incoming.state != known->state || incoming.incarnation != known->incarnation;
        const auto since = state_changed ? now : known->since, heard = known->heard;
        *known = entry_of(incoming, known->card);
        known->since = since;
        known->heard = heard;
        track_locked(*known);
        return Merge::Updated;
    }
    if (precedence(incoming) == known_precedence) {
        if (incoming.round >= known->round && incoming.step_seconds > 0.0)
            known->step_seconds = incoming.step_seconds;
        known->round = std::max(known->round, incoming.round);
        known->paired_through = std::max(known->paired_through, incoming.paired_through);
        known->solo_through = std::max(known->solo_through, incoming.solo_through);
    }
    return Merge::Ignored;
}

MemberTable::Entry* MemberTable::find_locked(uint64_t node_id) {
    const auto it = index_.find(node_id);
    return it == index_.end() ? nullptr : &others_[it->second];
}

void MemberTable::track_locked(Entry& entry) {
    entry.compatible = compatible_card(*entry.card);
    if (entry.state == MemberState::Alive)
        timed_.erase(entry.node_id());
    else
        timed_.insert(entry.node_id());
    note_pairable_change_locked(entry.node_id());
}

void MemberTable::note_pairable_change_locked(uint64_t node_id) {
    if (pairable_stale_) return;
    // Past a sixteenth of the table a rebuild costs less than the merge.
    if (pairable_changed_.size() >= std::max<size_t>(64, others_.size() / 16)) {
        pairable_stale_ = true;
        pairable_changed_.clear();
        return;
    }
    pairable_changed_.push_back(node_id);
}

bool MemberTable::pairable_id_locked(uint64_t node_id) const {
    const auto it = index_.find(node_id);
    return it != index_.end() && pairable_locked(others_[it->second]);
}

void MemberTable::refresh_pairable_locked() const {
    if (pairable_stale_) {
        pairable_sorted_.clear();
        for (const Entry& e : others_)
            if (pairable_locked(e)) pairable_sorted_.push_back(e.node_id());
        std::sort(pairable_sorted_.begin(), pairable_sorted_.end());
        pairable_stale_ = false;
        pairable_changed_.clear();
        return;
    }
    if (pairable_changed_.empty()) return;
    std::sort(pairable_changed_.begin(), pairable_changed_.end());
    pairable_changed_.erase(std::unique(pairable_changed_.begin(), pairable_changed_.end()),
                            pairable_changed_.end());
    // One pass over both sorted lists: the unchanged kept, the changed as they are now.
    std::vector<uint64_t> merged;
    merged.reserve(pairable_sorted_.size() + pairable_changed_.size());
    auto changed = pairable_changed_.begin();
    for (const uint64_t id : pairable_sorted_) {
        for (; changed != pairable_changed_.end() && *changed < id; ++changed)
            if (pairable_id_locked(*changed)) merged.push_back(*changed);
        if (changed != pairable_changed_.end() && *changed == id) {
            if (pairable_id_locked(id)) merged.push_back(id);
            ++changed;
            continue;
        }
        merged.push_back(id);
    }
    for (; changed != pairable_changed_.end(); ++changed)
        if (pairable_id_locked(*changed)) merged.push_back(*changed);
    pairable_sorted_ = std::move(merged);
    pairable_changed_.clear();
}

void MemberTable::insert_locked(Entry entry) {
    index_.emplace(entry.node_id(), others_.size());
    others_.push_back(std::move(entry));
    track_locked(others_.back());
}

void MemberTable::erase_locked(uint64_t node_id) {
    const auto it = index_.find(node_id);
    const size_t place = it->second;
    index_.erase(it);
    timed_.erase(node_id);
    note_pairable_change_locked(node_id);
    if (place + 1 != others_.size()) {
        others_[place] = std::move(others_.back());
        index_[others_[place].node_id()] = place;
    }
    others_.pop_back();
}

void MemberTable::suspect(uint64_t node_id, SteadyClock::time_point now) {
    MutexLock lock(mutex_);
    Entry* member = find_locked(node_id);
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
        Entry& m = *find_locked(id);
        if (m.state == MemberState::Suspect && now - m.since >= suspicion) {
            m.state = MemberState::Dead;
            m.since = now;
            declared_dead.push_back(id);
        }
        if (gone(m.state) && now - m.since >= limits_.retention) {
            tombstones_[id] = {m.incarnation, now};
            burials_.emplace_back(now, id);
            purged.push_back(id);
        }
    }
    for (const uint64_t id : purged) erase_locked(id);
    // Tombstones outlive any digest still in flight by a wide margin, then go, the oldest first
    // past max_members, so the table of them stays bounded too. A burial whose tombstone went
    // (a later incarnation came) or was dug again later is passed over.
    while (!burials_.empty()) {
        const auto [buried, id] = burials_.front();
        const auto tomb = tombstones_.find(id);
        const bool current = tomb != tombstones_.end() && tomb->second.second == buried;
        if (current && now - buried < 10 * limits_.retention &&
            tombstones_.size() <= limits_.max_members)
            break;
        if (current) tombstones_.erase(tomb);
        burials_.pop_front();
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

void MemberTable::set_reachability(Reachability reachability) {
    MutexLock lock(mutex_);
    if (self_.reachability == reachability) return;
    self_.reachability = reachability;
    self_.incarnation++;
}

void MemberTable::set_anchors(std::vector<uint64_t> anchors) {
    MutexLock lock(mutex_);
    if (self_.anchors == anchors) return;
    self_.anchors = std::move(anchors);
    self_.incarnation++;
}

void MemberTable::set_choice(uint64_t round, bool paired) {
    MutexLock lock(mutex_);
    uint64_t& through = paired ? self_.paired_through : self_.solo_through;
    through = std::max(through, round + 1);
}

void MemberTable::note_round(uint64_t node_id, uint64_t round, SteadyClock::time_point now) {
    MutexLock lock(mutex_);
    if (Entry* member = find_locked(node_id)) {
        member->round = std::max(member->round, round);
        member->heard = now;
    }
}

void MemberTable::heard_from(uint64_t node_id, SteadyClock::time_point now) {
    MutexLock lock(mutex_);
    if (Entry* member = find_locked(node_id)) member->heard = now;
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
    return member_of(others_[it->second]);
}

std::optional<MemberState> MemberTable::state_of(uint64_t node_id) const {
    MutexLock lock(mutex_);
    if (node_id == self_.node_id) return self_.state;
    const auto it = index_.find(node_id);
    if (it == index_.end()) return std::nullopt;
    return others_[it->second].state;
}

std::optional<uint64_t> MemberTable::alive_round(uint64_t node_id) const {
    MutexLock lock(mutex_);
    if (node_id == self_.node_id)
        return self_.state == MemberState::Alive ? std::optional(self_.round) : std::nullopt;
    const auto it = index_.find(node_id);
    if (it == index_.end() || others_[it->second].state != MemberState::Alive) return std::nullopt;
    return others_[it->second].round;
}

std::vector<Member> MemberTable::all() const {
    MutexLock lock(mutex_);
    std::vector<Member> members{self_};
    members.reserve(others_.size() + 1);
    for (const Entry& entry : others_) members.push_back(member_of(entry));
    return members;
}

std::vector<Member> MemberTable::reachable_others() const {
    MutexLock lock(mutex_);
    std::vector<Member> members;
    for (const Entry& entry : others_)
        if (!gone(entry.state)) members.push_back(member_of(entry));
    return members;
}

std::vector<Member> MemberTable::sample_reachable(size_t k, uint64_t excluded,
                                                  std::mt19937_64& rng) const {
    MutexLock lock(mutex_);
    const auto usable = [&](const Entry& e) { return !gone(e.state) && e.node_id() != excluded; };
    std::vector<Member> chosen;
    if (k == 0 || others_.empty()) return chosen;
    // Draws with rejection while the table is large next to k; when that keeps missing (most
    // entries gone) or the table is small, a shuffle of every usable entry.
    if (others_.size() > 4 * k) {
        // A few dozen places: a scan finds a repeat without a node allocated per draw.
        std::vector<size_t> drawn;
        drawn.reserve(k);
        std::uniform_int_distribution<size_t> place(0, others_.size() - 1);
        // The first k draws, which are always made, are made at once and their entries and cards
        // fetched together: in a large table each is a cache miss, and one after another they
        // were a sixth of a simulated 1,000-node swarm's time (each node's table is cold when it
        // gossips).
        std::vector<size_t> first(k);
        for (size_t& i : first) {
            i = place(rng);
            __builtin_prefetch(&others_[i].card);
            __builtin_prefetch(&others_[i].state);
        }
        for (const size_t i : first) __builtin_prefetch(others_[i].card.get());
        for (size_t tries = 0; chosen.size() < k && tries < 8 * k; ++tries) {
            const size_t i = tries < k ? first[tries] : place(rng);
            if (!usable(others_[i]) || std::find(drawn.begin(), drawn.end(), i) != drawn.end())
                continue;
            drawn.push_back(i);
            chosen.push_back(member_of(others_[i]));
        }
        if (chosen.size() == k) return chosen;
        chosen.clear();
    }
    std::vector<size_t> candidates;
    for (size_t i = 0; i < others_.size(); i++)
        if (usable(others_[i])) candidates.push_back(i);
    std::shuffle(candidates.begin(), candidates.end(), rng);
    if (candidates.size() > k) candidates.resize(k);
    for (const size_t i : candidates) chosen.push_back(member_of(others_[i]));
    return chosen;
}

size_t MemberTable::others_count() const {
    MutexLock lock(mutex_);
    return others_.size();
}

bool MemberTable::compatible(const Member& member) const {
    return compatible_with(member.fingerprint, member.protocol_version, member.swarm_id,
                           member.method);
}

bool MemberTable::compatible_card(const Card& card) const {
    return compatible_with(card.fingerprint, card.protocol_version, card.swarm_id, card.method);
}

bool MemberTable::compatible_with(std::string_view fingerprint, uint32_t protocol_version,
                                  std::string_view swarm_id, std::string_view method) const {
    return fingerprint == fingerprint_ && protocol_version == protocol_version_ &&
           swarm_id == swarm_id_ && (method.empty() || method_.empty() || method == method_);
}

bool MemberTable::pairable_locked(const Entry& e) const {
    return e.state == MemberState::Alive && e.compatible;
}

std::vector<uint64_t> MemberTable::pairable_ids() const {
    MutexLock lock(mutex_);
    refresh_pairable_locked();
    std::vector<uint64_t> ids;
    ids.reserve(pairable_sorted_.size() + 1);
    const auto self_place =
        std::lower_bound(pairable_sorted_.begin(), pairable_sorted_.end(), self_.node_id);
    ids.insert(ids.end(), pairable_sorted_.begin(), self_place);
    if (self_.state == MemberState::Alive) ids.push_back(self_.node_id);
    ids.insert(ids.end(), self_place, pairable_sorted_.end());
    return ids;
}

std::vector<PairingFacts> MemberTable::pairable_facts() const {
    MutexLock lock(mutex_);
    std::vector<PairingFacts> facts;
    facts.reserve(others_.size());
    for (const Entry& e : others_)
        if (pairable_locked(e))
            facts.push_back(facts_of(e.node_id(), e.round, e.paired_through, e.solo_through,
                                     e.reachability, !e.anchors.empty(), e.heard));
    return facts;
}

std::vector<uint64_t> MemberTable::private_pairable_ids() const {
    MutexLock lock(mutex_);
    std::vector<uint64_t> ids;
    if (self_.state == MemberState::Alive && !callable(self_)) ids.push_back(self_.node_id);
    for (const Entry& e : others_)
        if (pairable_locked(e) && e.reachability == Reachability::Private)
            ids.push_back(e.node_id());
    std::sort(ids.begin(), ids.end());
    return ids;
}

std::vector<double> MemberTable::pairable_step_seconds() const {
    MutexLock lock(mutex_);
    std::vector<double> seconds;
    if (self_.state == MemberState::Alive && self_.step_seconds > 0.0)
        seconds.push_back(self_.step_seconds);
    for (const Entry& e : others_)
        if (pairable_locked(e) && e.step_seconds > 0.0) seconds.push_back(e.step_seconds);
    return seconds;
}

}  // namespace starling
