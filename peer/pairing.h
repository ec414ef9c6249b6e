// Partner choice for groups of two (CHOOSE_PARTNERS of docs/spec.md section 4): the
// rules a node applies to proposals, kept apart from the network so each is testable alone.
// peer_node.h sends the proposals (Pair) and answers them with a PairingBook.
//
// A node accepts proposals only while it is choosing its own partner for that very round (between
// open() and close()): never for a later round while it trains, nor while it exchanges, nor after
// it has gone solo. So a pairing is agreed by two nodes that are both at the round's end and
// about to exchange, and a stall cannot chain from one stuck exchange into the next rounds.
//
// While choosing, a node proposes to the partner its deterministic matching names, which accepts
// only when its own matching over the same view (equal membership digests) names the proposer;
// if that fails, to a member at random, which accepts when it is free for the round; and it asks
// again until the pair timeout, since partners finish their inner phases at different times.
// Every acceptance is recorded at once, and a node with a proposal out declines everyone but the
// node it proposed to, so no node ends up in two pairs. Two nodes proposing to each other at once
// settle it by the lower (nonce, node id): that proposal is accepted, the other declined as
// "crossed", and its sender waits for the winning proposal instead of asking elsewhere.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "common/mutex.h"
#include "peer/membership.h"

namespace starling {

enum class PairMode { Deterministic, Random };

// How long a node choosing its partner listens for proposals between two rounds of asking.
inline constexpr std::chrono::milliseconds kPairRetry{100};
// Random requests ask the partners of this many previous rounds last, for better mixing.
inline constexpr uint64_t kRecentPartnerRounds = 4;
// The share of the pair timeout a node spends asking the members left out (left_out_members)
// before anyone else: the rest is left for pairing with the others when they never come.
inline constexpr double kLeftOutShare = 0.75;

struct PairProposal {
    uint64_t from = 0;
    uint64_t round = 0;
    uint64_t nonce = 0;
    PairMode mode = PairMode::Random;
    uint64_t membership_digest = 0;  // of the proposer's pairable view
};

// What a deterministic proposal is set against: the callee's deterministic partner for the
// proposal's round (none: solo), and its pairable view's digest, which a decline's reason compares
// with the proposer's.
struct DeterministicView {
    uint64_t membership_digest = 0;
    std::optional<uint64_t> partner;
};

// What the callee's own view says, for judging a proposal.
struct PairingView {
    uint64_t round = 0;  // the callee's current round
    // Called only for a deterministic proposal that gets that far: it is a pass or two over the
    // whole view, which at thousands of members cost more than the rest of answering, while most
    // proposals are random or declined first.
    std::function<DeterministicView()> deterministic;
};

struct PairAnswer {
    bool accepted = false;
    bool crossed = false;    // declined because our own proposal to the proposer wins the tiebreak
    bool ask_again = false;  // declined for now only: not choosing for the round yet, or busy
    std::string reason;      // why not, when declined
};

// The deterministic matching's buckets (deterministic_partner): a member whose round key ends in
// j zero base-4 digits starts a bucket at levels 1 to j, so a bucket holds about 4^j members.
// Views of up to kMatchingBucketedPast members are one bucket.
inline constexpr size_t kMatchingBucketedPast = 64;
inline constexpr uint64_t kMatchingSalt = 0x6d61746368696e67;  // "matching"

// Self's partner in the round's deterministic matching of `view`; none when self is left alone or
// not in the view. Each member's key is a hash of (round, id), which orders the view. The matching
// runs in two passes, each level by level. At level 1 the view is cut into buckets of about 4
// members, at level 2 of about 16, and so on. The first pass pairs, in each bucket, each private
// member (`unreachable`) with the next public one while there are both; the rest (all of one
// kind) go on to the next level, until a level with one bucket. The second pass takes those left
// and pairs them as neighbours in each bucket, the one a bucket may leave going on to the next
// level (private ones through a relay, peer/exchange_relay.h); at most one member ends alone. So
// private members meet public ones as often as the numbers allow, and two views that differ in a
// few members give the same partners except to a few members near each difference at each level,
// where a matching drawn from the whole view's digest would differ everywhere: at thousands of
// members two nodes' views seldom agree exactly. A view of up to kMatchingBucketedPast members is
// one bucket.
std::optional<uint64_t> deterministic_partner(uint64_t round, std::span<const uint64_t> view,
                                              uint64_t self,
                                              std::span<const uint64_t> unreachable = {});

// Whether the member's digest says it has chosen its partner for `round` already, or is past it
// (rounds only go up): a proposal for that round is declined for good, so it is not worth a call.
// A node that comes late to a round then learns at once that nobody is left to ask, instead of
// spending its whole pair timeout asking each member in turn and arriving late at the next round
// too (the simulator found such a node solo round after round on a wide-area network).
bool done_with(const PairingFacts& m, uint64_t round);
bool done_with(const Member& m, uint64_t round);

// Whether a member can be proposed to: at its address when it is callable, else through its
// anchors (peer/anchors.h). A callable proposer then waits for the private member's exchange
// stream; a private one exchanges with it through the anchor that passed the proposal on
// (needs_relay).
bool can_propose_to(const Member& m);

// Whether neither side can dial the other: their exchange goes through a relay
// (peer/exchange_relay.h).
bool needs_relay(const Member& self, const Member& partner);

// Whether a proposal from `self` to `target` names the anchor it goes through as the exchange's
// relay: where members cannot dial the target and this node cannot say they can dial it, its own
// verdict private or still pending (peer/reachability.h). A node that turns out private after
// proposing without one would leave both sides with no path; a pairing that agreed a relay takes
// it whatever the verdicts say by the exchange.
bool proposes_relay(const Member& self, const Member& target);

// Why `self` declines a proposal from `proposer` for the path it names (`relay`: the anchor it
// went through, 0 for none; `names_own_anchor`: whether that is one of self's anchors), "" when
// the path is one both can take: two private members meet at one of self's anchors.
std::string path_refusal(const Member& self, const Member& proposer, uint64_t relay,
                         bool names_own_anchor);

// Whether `self` opens the exchange stream with `partner` rather than wait for the partner's: a
// node members cannot dial opens it to one they can (connection reversal, so the exchange still
// runs direct); otherwise the lower id opens it.
bool opens_exchange(const Member& self, const Member& partner);

// Members a random request may go to, in the order to ask them: pairable (the caller filters),
// not self, advertising a round within max_round_gap of ours and not done with ours (done_with);
// shuffled by `seed`, the `recent` partners after all the others. Asking them last rather than
// never favours new partners for mixing without leaving a small swarm, where the recent partners
// are most members, short of any. A node members cannot dial (`self_callable` false) asks the
// private members after all of those, as an exchange with them takes a relay's capacity. Within
// each of those parts, the members heard from first hand since `heard_since` come first
// (PairingFacts::heard, peer/round_pacing.h's heard_lately_since): in a large swarm gossip brings
// a member's round and choices a round late or more, and of the members a stale view lists as
// still to choose most had chosen already (the simulator at 1,000 nodes: a choice's p90 3.8 s,
// 91% of choices paired; docs/scale.md).
std::vector<uint64_t> random_candidates(
    std::span<const PairingFacts> pairable, uint64_t self, uint64_t round, uint64_t max_round_gap,
    std::span<const uint64_t> recent, uint64_t seed, bool self_callable = true,
    SteadyClock::time_point heard_since = SteadyClock::time_point::min());

// How many members, in expectation, adopt each member left out (left_out_members).
inline constexpr double kLeftOutAdopters = 3.0;

// Whether `self` adopts the left-out member `left_out` for `round`: a draw from a hash of the
// three, true with probability min(1, adopters / members) where `members` is the size of the view.
// Every node draws alone, so about `adopters` members ask each left-out one first, a different few
// each round.
bool adopts(uint64_t self, uint64_t left_out, uint64_t round, size_t members, double adopters);

// Members that a node choosing its partner for `round` asks before anyone else, so that no member
// is left out of the averaging round after round (docs/spec.md section 4): pairable (the caller
// filters), not self, within max_round_gap of `round` and not done with it (done_with), whose last
// choice of a partner found none (solo_last), and adopted by self (adopts, over the pairable
// view). Those at `round` first (choosing now), then those behind it (still training toward it),
// each part shuffled by `seed`. Only a few adopt each: when every member asked every left-out one
// first, a swarm on a wide-area network spent most of its pair timeout in proposals to the same
// few members, each busy with its own (the simulator found 84-88% of choices paired at 100 nodes,
// 95-96% without the rule).
std::vector<uint64_t> left_out_members(std::span<const PairingFacts> pairable, uint64_t self,
                                       uint64_t round, uint64_t max_round_gap, uint64_t seed,
                                       double adopters = kLeftOutAdopters);

// One node's pairings, per round, for the last few rounds.
class PairingBook {
public:
    // Rounds kept: enough for the recent-partner rule (4 rounds) and the round gap on either side.
    static constexpr uint64_t kRoundsKept = 8;

    PairingBook(uint64_t self, uint64_t max_round_gap);

    std::optional<uint64_t> partner(uint64_t round) const;
    // Partners of the `rounds` rounds before `round`.
    std::vector<uint64_t> recent_partners(uint64_t round, uint64_t rounds) const;
    size_t rounds_held() const;

    // This node is choosing its partner for `round` from now until close(round): the only time it
    // accepts proposals.
    void open(uint64_t round);
    void close(uint64_t round);
    // Whether our proposal to `to` for `round` is out, its answer not yet recorded.
    bool proposing_to(uint64_t round, uint64_t to) const;

    // Marks our proposal to `to` as out. False when the round already has a partner or another
    // proposal of ours is out.
    bool begin_proposal(uint64_t round, uint64_t to, uint64_t nonce);
    // The answer to our proposal: clears it and, when accepted, records the pairing. Returns the
    // round's partner, if any (a crossing proposal may have been accepted meanwhile).
    std::optional<uint64_t> end_proposal(uint64_t round, bool accepted);
    // Waits until the round has a partner, `until` passes or stop() is called.
    std::optional<uint64_t> await_partner(uint64_t round, SteadyClock::time_point until);

    // Judges a proposal and, when accepting, records the pairing. A proposal from the node already
    // recorded as the round's partner is accepted again (a retried call).
    PairAnswer consider(const PairProposal& proposal, const PairingView& view);

    void stop();

private:
    struct Proposal {
        uint64_t to = 0;
        uint64_t nonce = 0;
    };
    struct RoundState {
        std::optional<uint64_t> partner;
        std::optional<Proposal> proposal;  // ours, while its answer is awaited
    };
    RoundState& state_locked(uint64_t round) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);

    uint64_t self_;
    uint64_t max_round_gap_;
    mutable Mutex mutex_;
    std::condition_variable paired_;
    std::map<uint64_t, RoundState> rounds_ ABSL_GUARDED_BY(mutex_);
    std::optional<uint64_t> open_round_ ABSL_GUARDED_BY(mutex_);
    // The newest round this node has chosen for.
    std::optional<uint64_t> closed_round_ ABSL_GUARDED_BY(mutex_);
    bool stopped_ ABSL_GUARDED_BY(mutex_) = false;
};

}  // namespace starling
