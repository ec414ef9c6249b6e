#include "peer/pairing.h"

#include <algorithm>
#include <bit>
#include <random>
#include <tuple>

#include "common/random.h"

namespace starling {
namespace {

uint64_t distance(uint64_t a, uint64_t b) { return a > b ? a - b : b - a; }

PairAnswer declined(std::string reason) { return {false, false, false, std::move(reason)}; }
PairAnswer not_now(std::string reason) { return {false, false, true, std::move(reason)}; }

std::string round_text(uint64_t round) { return "round " + std::to_string(round); }

// The ids of each list in an order of `rng` alone (the member table's order must not matter),
// the lists one after the other.
std::vector<uint64_t> shuffled_in_turn(std::initializer_list<std::vector<uint64_t>*> lists,
                                       std::mt19937_64& rng) {
    std::vector<uint64_t> out;
    for (auto* ids : lists) {
        std::sort(ids->begin(), ids->end());
        std::shuffle(ids->begin(), ids->end(), rng);
        out.insert(out.end(), ids->begin(), ids->end());
    }
    return out;
}

// A member's place in a round's matching: its key orders the view and sets the buckets it starts.
struct Placed {
    uint64_t key = 0;
    uint64_t id = 0;
    bool is_private = false;
    auto operator<=>(const Placed&) const = default;
};

// The highest level at which the member starts a bucket: its key's zero base-4 digits from the low
// end.
int landmark_level(const Placed& p) { return p.key == 0 ? 64 : std::countr_zero(p.key) / 2; }

// The two passes of the matching: private members with public ones, then those left as neighbours.
enum class Pass { Cross, Neighbours };

// One bucket's members, in key order, at one level of a pass: Cross pairs each private member with
// the next public one while there are both and leaves the rest (all of one kind) alone; Neighbours
// pairs them in turn and leaves at most one. Returns self's partner when self is paired here;
// appends those left alone to `left`.
std::optional<uint64_t> match_bucket(std::span<const Placed* const> bucket, uint64_t self,
                                     Pass pass, std::vector<const Placed*>& left) {
    std::optional<uint64_t> partner;
    const auto pair = [&](const Placed* a, const Placed* b) {
        if (a->id == self) partner = b->id;
        if (b->id == self) partner = a->id;
    };
    if (pass == Pass::Neighbours) {
        size_t i = 0;
        for (; i + 1 < bucket.size(); i += 2) pair(bucket[i], bucket[i + 1]);
        if (i < bucket.size()) left.push_back(bucket[i]);
        return partner;
    }
    std::vector<const Placed*> hidden, open;
    for (const Placed* p : bucket) (p->is_private ? hidden : open).push_back(p);
    const size_t crossed = std::min(hidden.size(), open.size());
    for (size_t i = 0; i < crossed; i++) pair(hidden[i], open[i]);
    const auto& rest = hidden.size() > crossed ? hidden : open;
    left.insert(left.end(), rest.begin() + static_cast<std::ptrdiff_t>(crossed), rest.end());
    return partner;
}

// The matching level by level, Cross first and then Neighbours over the members Cross left: at
// each level the members still alone, in key order, are cut into buckets at the members (of the
// whole view) that start one at that level, and each bucket pairs its own; the first level at
// which nobody starts a bucket (`one_bucket`: level 1) takes all that are left as one bucket and
// ends the pass.
std::optional<uint64_t> match_by_levels(std::vector<Placed> placed, uint64_t self,
                                        bool one_bucket) {
    std::sort(placed.begin(), placed.end());
    std::vector<std::vector<uint32_t>> bucket_of;  // [level - 1][member]: its bucket there
    const auto buckets_at = [&](size_t level) -> const std::vector<uint32_t>& {
        while (bucket_of.size() < level) {
            // A member's bucket: how many members start one at this level up to it.
            std::vector<uint32_t>& of = bucket_of.emplace_back(placed.size());
            uint32_t starts = 0;
            for (size_t i = 0; i < placed.size(); i++) {
                starts += !one_bucket && landmark_level(placed[i]) >= static_cast<int>(level);
                of[i] = starts;
            }
        }
        return bucket_of[level - 1];
    };
    std::vector<const Placed*> alone;
    for (const Placed& p : placed) alone.push_back(&p);
    for (const Pass pass : {Pass::Cross, Pass::Neighbours}) {
        for (size_t level = 1; alone.size() > 1; level++) {
            const auto& of = buckets_at(level);
            const bool top = of.back() == 0;
            const auto bucket = [&](const Placed* p) { return of[p - placed.data()]; };
            std::vector<const Placed*> left;
            for (auto first = alone.begin(); first != alone.end();) {
                const auto last = std::find_if(first, alone.end(), [&](const Placed* p) {
                    return bucket(p) != bucket(*first);
                });
                if (const auto partner = match_bucket({first, last}, self, pass, left))
                    return partner;
                first = last;
            }
            alone.swap(left);
            if (top) break;
        }
    }
    return std::nullopt;
}

}  // namespace

std::optional<uint64_t> deterministic_partner(uint64_t round, std::span<const uint64_t> view,
                                              uint64_t self,
                                              std::span<const uint64_t> unreachable) {
    if (std::find(view.begin(), view.end(), self) == view.end()) return std::nullopt;
    std::vector<uint64_t> hidden(unreachable.begin(), unreachable.end());
    std::sort(hidden.begin(), hidden.end());
    const uint64_t seed = hash_index(round, kMatchingSalt);
    std::vector<Placed> placed;
    placed.reserve(view.size());
    for (const uint64_t id : view)
        placed.push_back(
            {hash_index(seed, id), id, std::binary_search(hidden.begin(), hidden.end(), id)});
    if (placed.size() <= kMatchingBucketedPast)
        return match_by_levels(std::move(placed), self, true);
    // Most members pair in their first-level bucket, found in one pass without sorting the view.
    const Placed own =
        *std::find_if(placed.begin(), placed.end(), [&](const Placed& p) { return p.id == self; });
    std::optional<Placed> from, to;  // the members that start self's bucket and the next one
    for (const Placed& p : placed) {
        if (landmark_level(p) < 1) continue;
        if (p <= own && (!from || *from < p)) from = p;
        if (own < p && (!to || p < *to)) to = p;
    }
    std::vector<Placed> bucket;
    for (const Placed& p : placed)
        if ((!from || *from <= p) && (!to || p < *to)) bucket.push_back(p);
    std::sort(bucket.begin(), bucket.end());
    std::vector<const Placed*> members, left;
    for (const Placed& p : bucket) members.push_back(&p);
    // Where nobody is private, Cross leaves everyone alone and this is Neighbours' first level.
    const bool any_private =
        std::any_of(placed.begin(), placed.end(), [](const Placed& p) { return p.is_private; });
    if (const auto partner =
            match_bucket(members, self, any_private ? Pass::Cross : Pass::Neighbours, left))
        return partner;
    return match_by_levels(std::move(placed), self, false);
}

bool done_with(const PairingFacts& m, uint64_t round) {
    return m.round > round || std::max(m.paired_through, m.solo_through) > round;
}

bool done_with(const Member& m, uint64_t round) { return done_with(pairing_facts(m), round); }

bool can_propose_to(const Member& m) { return pairing_facts(m).proposable; }

bool needs_relay(const Member& self, const Member& partner) {
    return !callable(self) && !callable(partner);
}

bool proposes_relay(const Member& self, const Member& target) {
    return !callable(target) && self.reachability != Reachability::Public;
}

std::string path_refusal(const Member& self, const Member& proposer, uint64_t relay,
                         bool names_own_anchor) {
    if ((relay != 0 || needs_relay(self, proposer)) && !names_own_anchor)
        return "node " + format_node_id(proposer.node_id) +
               " names no anchor of this node as the relay of its proposal";
    return "";
}

bool opens_exchange(const Member& self, const Member& partner) {
    if (callable(self) != callable(partner)) return !callable(self);
    return self.node_id < partner.node_id;
}

std::vector<uint64_t> random_candidates(std::span<const PairingFacts> pairable, uint64_t self,
                                        uint64_t round, uint64_t max_round_gap,
                                        std::span<const uint64_t> recent, uint64_t seed,
                                        bool self_callable, SteadyClock::time_point heard_since) {
    // [relayed][was a partner][not heard lately]
    std::vector<uint64_t> lists[2][2][2];
    for (const PairingFacts& m : pairable) {
        if (m.node_id == self || distance(m.round, round) > max_round_gap || done_with(m, round))
            continue;
        const bool was_partner = std::find(recent.begin(), recent.end(), m.node_id) != recent.end();
        const bool relayed = !self_callable && !m.callable;
        lists[relayed][was_partner][m.heard < heard_since].push_back(m.node_id);
    }
    std::mt19937_64 rng(seed);
    return shuffled_in_turn({&lists[0][0][0], &lists[0][0][1], &lists[0][1][0], &lists[0][1][1],
                             &lists[1][0][0], &lists[1][0][1], &lists[1][1][0], &lists[1][1][1]},
                            rng);
}

bool adopts(uint64_t self, uint64_t left_out, uint64_t round, size_t members, double adopters) {
    const double share = adopters / static_cast<double>(std::max<size_t>(members, 1));
    if (share >= 1.0) return true;
    const uint64_t draw = hash_index(hash_index(round, left_out), self);
    return static_cast<double>(draw) < share * 18446744073709551616.0;  // 2^64
}

std::vector<uint64_t> left_out_members(std::span<const PairingFacts> pairable, uint64_t self,
                                       uint64_t round, uint64_t max_round_gap, uint64_t seed,
                                       double adopters) {
    std::vector<uint64_t> at_round, behind;
    for (const PairingFacts& m : pairable) {
        if (m.node_id == self || done_with(m, round) || round - m.round > max_round_gap) continue;
        if (solo_last(m) && adopts(self, m.node_id, round, pairable.size(), adopters))
            (m.round == round ? at_round : behind).push_back(m.node_id);
    }
    std::mt19937_64 rng(seed);
    return shuffled_in_turn({&at_round, &behind}, rng);
}

PairingBook::PairingBook(uint64_t self, uint64_t max_round_gap)
    : self_(self), max_round_gap_(max_round_gap) {}

PairingBook::RoundState& PairingBook::state_locked(uint64_t round) {
    RoundState& state = rounds_[round];
    // Forget rounds too old to matter, so the book stays small however long the node runs.
    const uint64_t newest = rounds_.rbegin()->first;
    if (newest > kRoundsKept) {
        std::erase_if(rounds_, [&](const auto& entry) {
            return entry.first < newest - kRoundsKept && entry.first != round;
        });
    }
    return state;
}

std::optional<uint64_t> PairingBook::partner(uint64_t round) const {
    MutexLock lock(mutex_);
    const auto it = rounds_.find(round);
    return it == rounds_.end() ? std::nullopt : it->second.partner;
}

std::vector<uint64_t> PairingBook::recent_partners(uint64_t round, uint64_t rounds) const {
    MutexLock lock(mutex_);
    std::vector<uint64_t> partners;
    for (const auto& [r, state] : rounds_)
        if (r < round && round - r <= rounds && state.partner) partners.push_back(*state.partner);
    return partners;
}

size_t PairingBook::rounds_held() const {
    MutexLock lock(mutex_);
    return rounds_.size();
}

void PairingBook::open(uint64_t round) {
    MutexLock lock(mutex_);
    open_round_ = round;
}

void PairingBook::close(uint64_t round) {
    MutexLock lock(mutex_);
    if (open_round_ == round) open_round_.reset();
    closed_round_ = std::max(closed_round_.value_or(round), round);
}

bool PairingBook::proposing_to(uint64_t round, uint64_t to) const {
    MutexLock lock(mutex_);
    const auto it = rounds_.find(round);
    return it != rounds_.end() && it->second.proposal && it->second.proposal->to == to;
}

bool PairingBook::begin_proposal(uint64_t round, uint64_t to, uint64_t nonce) {
    MutexLock lock(mutex_);
    RoundState& state = state_locked(round);
    if (stopped_ || state.partner || state.proposal) return false;
    state.proposal = Proposal{to, nonce};
    return true;
}

std::optional<uint64_t> PairingBook::end_proposal(uint64_t round, bool accepted) {
    MutexLock lock(mutex_);
    RoundState& state = state_locked(round);
    // While the proposal was out, only a crossing one from the same node could have been
    // accepted, so an acceptance never contradicts a recorded partner.
    if (accepted && state.proposal && !state.partner) {
        state.partner = state.proposal->to;
        paired_.notify_all();
    }
    state.proposal.reset();
    return state.partner;
}

std::optional<uint64_t> PairingBook::await_partner(uint64_t round, SteadyClock::time_point until) {
    MutexLock lock(mutex_);
    lock.wait_until(paired_, until, [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) {
        const auto it = rounds_.find(round);
        return stopped_ || (it != rounds_.end() && it->second.partner);
    });
    const auto it = rounds_.find(round);
    return it == rounds_.end() ? std::nullopt : it->second.partner;
}

PairAnswer PairingBook::consider(const PairProposal& proposal, const PairingView& view) {
    if (distance(proposal.round, view.round) > max_round_gap_)
        return declined(round_text(proposal.round) + " is more than " +
                        std::to_string(max_round_gap_) + " round(s) from this node's " +
                        round_text(view.round));
    MutexLock lock(mutex_);
    if (stopped_) return declined("this node is stopping");
    RoundState& state = state_locked(proposal.round);
    if (state.partner) {
        if (*state.partner == proposal.from) return {true, false, false, ""};
        return declined("already paired with node " + format_node_id(*state.partner) + " for " +
                        round_text(proposal.round));
    }
    if (open_round_ != proposal.round) {
        // Still to come here (this node trains toward it): worth asking again. Otherwise this node
        // has chosen for that round already, or is past it.
        const bool to_come = open_round_ ? proposal.round > *open_round_
                                         : proposal.round >= view.round &&
                                               (!closed_round_ || proposal.round > *closed_round_);
        const std::string why =
            "not choosing a partner for " + round_text(proposal.round) + " now (" +
            (open_round_ ? "choosing for " + round_text(*open_round_)
                         : "at " + round_text(view.round) + ", training or exchanging") +
            ")";
        return to_come ? not_now(why) : declined(why);
    }
    if (proposal.mode == PairMode::Deterministic) {
        const DeterministicView ours = view.deterministic();
        // Views that differ name the same partners for most members (deterministic_partner):
        // only the partner must agree.
        if (ours.partner != proposal.from)
            return declined(
                "this node's deterministic partner for " + round_text(proposal.round) + " is " +
                (ours.partner ? "node " + format_node_id(*ours.partner) : std::string("nobody")) +
                (proposal.membership_digest != ours.membership_digest
                     ? " (the membership views differ)"
                     : ""));
    }
    if (state.proposal) {
        if (state.proposal->to != proposal.from)
            return not_now("busy: proposing to node " + format_node_id(state.proposal->to) +
                           " for " + round_text(proposal.round));
        if (std::tie(state.proposal->nonce, self_) < std::tie(proposal.nonce, proposal.from))
            return {false, true, false,
                    "crossed proposals for " + round_text(proposal.round) + ": this node's wins"};
    }
    state.partner = proposal.from;
    paired_.notify_all();
    return {true, false, false, ""};
}

void PairingBook::stop() {
    MutexLock lock(mutex_);
    stopped_ = true;
    paired_.notify_all();
}

}  // namespace starling
