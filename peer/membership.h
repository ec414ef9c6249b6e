// What a node knows of the swarm: one entry per member, merged from gossip by SWIM's rules, plus
// the node's own entry. Pure bookkeeping with no network, so every rule is testable on its own;
// peer_node.h drives it with probes and gossip.
//
// Rules, for one node id: the higher incarnation wins; at the same incarnation
// LEFT > DEAD > SUSPECT > ALIVE. A node starts at an incarnation taken from its start time, so a
// restarted node supersedes whatever the swarm remembers of its previous run. A node that hears
// itself suspected or declared dead at its own incarnation refutes by raising its incarnation.
// Unknown members reported DEAD or LEFT are not added, and purged members leave a tombstone, so
// departed nodes cannot circulate forever.
#pragma once

#include <absl/container/btree_set.h>
#include <absl/container/flat_hash_map.h>

#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "common/mutex.h"
#include "peer/identity.h"
#include "peer/reachability.h"

namespace starling {

using SteadyClock = std::chrono::steady_clock;

enum class MemberState { Alive = 1, Suspect = 2, Dead = 3, Left = 4 };
const char* member_state_name(MemberState state);

// Members of another version never pair. 2: round messages end with their author's signature
// (peer/message_signature.h), which version 1 neither sends nor expects.
inline constexpr uint32_t kProtocolVersion = 2;

struct Member {
    uint64_t node_id = 0;
    std::string address;
    uint64_t incarnation = 0;
    MemberState state = MemberState::Alive;
    uint64_t round = 0;
    // The round after the newest round it agreed a partner for, and after the newest round it went
    // solo (0: none yet); like the round, they only go up. solo_last() tells from them whether its
    // last round was solo.
    uint64_t paired_through = 0;
    uint64_t solo_through = 0;
    // Its mean inner step time over its last whole phase (0: none yet), as of its round above.
    double step_seconds = 0.0;
    std::string fingerprint;
    std::string model;  // the model's signature (model/config.h), for saying what differs
    // The outer method and message mode ("noloco fused", "diloco", ...); "": not said.
    std::string method;
    // Its own verdict on whether members can dial its address (peer/reachability.h).
    Reachability reachability = Reachability::Unknown;
    // A private member's anchors: the members it holds a stream to, through which calls reach it
    // (peer/anchors.h); at most kMaxAnchors, none for others.
    std::vector<uint64_t> anchors;
    uint32_t protocol_version = kProtocolVersion;
    std::string swarm_id;
    PublicKey public_key{};
    uint64_t instance = 0;
    SteadyClock::time_point since{};  // local: when this node learned the current state
    // Local: when the member's own word last reached this node (its gossip, its answer to a
    // probe, its pair traffic), which says its round as of then; a digest passed on by others can
    // be rounds old in a large swarm (heard_lately, peer/round_pacing.h).
    SteadyClock::time_point heard{};
};

inline constexpr size_t kMaxAnchors = 3;

// Whether a call to the member can reach it: not when it says members cannot dial it
// (peer/reachability.h). Such a member proposes itself and opens its exchanges; it is never
// proposed to, and its probes go through its anchors.
bool callable(const Member& m);

// What pacing and the choice of a partner read of a member (peer/round_pacing.h, peer/pairing.h):
// its rounds and whether it can be called, without its strings, so that a node choosing among
// thousands of members copies none (the simulator spent a third of its time in malloc doing so).
struct PairingFacts {
    uint64_t node_id = 0, round = 0, paired_through = 0, solo_through = 0;
    bool callable = false;            // callable(), below
    bool proposable = false;          // can_propose_to (peer/pairing.h): callable, or anchored
    SteadyClock::time_point heard{};  // Member::heard
    bool operator==(const PairingFacts&) const = default;
};
PairingFacts pairing_facts(const Member& m);
std::vector<PairingFacts> pairing_facts(const std::vector<Member>& members);

// Whether the member's newest choice of partner found none (a fresh member has made none).
inline bool solo_last(const PairingFacts& m) { return m.solo_through > m.paired_through; }
inline bool solo_last(const Member& m) { return solo_last(pairing_facts(m)); }

// Why `them` can never pair with `self`, for a log line or `starling check`: "runs another model
// (n_layer 4 there, 2 here)", "is in swarm 'b' (this node: 'a')", ...; "" when it can.
std::string incompatibility(const Member& them, const Member& self);

struct MembershipLimits {
    // SUSPECT to DEAD in a swarm of up to 10 members; larger ones wait this times log10 of their
    // size, as news (the suspicion, then its refutation) takes log N periods to reach everyone.
    std::chrono::milliseconds suspicion_timeout{5000};
    std::chrono::milliseconds retention{60000};  // DEAD and LEFT entries are listed this long
    size_t max_members = 4096;  // a hostile or broken peer cannot grow the table past this
};

class MemberTable {
public:
    MemberTable(Member self, MembershipLimits limits);

    enum class Merge { Ignored, Added, Updated, Refuted, Duplicate };
    // Applies one digest. Duplicate: a digest about this node's id from another instance that
    // is alive (someone else runs with the same key).
    Merge merge(const Member& incoming, SteadyClock::time_point now);

    // A direct and the indirect probes of a member failed: SUSPECT at its current incarnation.
    void suspect(uint64_t node_id, SteadyClock::time_point now);
    // SUSPECT past the suspicion timeout becomes DEAD; DEAD and LEFT past retention are purged.
    // Returns the ids declared dead by this call.
    std::vector<uint64_t> expire(SteadyClock::time_point now);
    // The suspicion timeout at the table's present size (MembershipLimits::suspicion_timeout).
    SteadyClock::duration suspicion_timeout() const;

    void set_round(uint64_t round);
    void set_step_seconds(double seconds);
    // This node agreed a partner for `round`, or found none.
    void set_choice(uint64_t round, bool paired);
    // A member is at least at `round`, as its own pair or exchange traffic just showed: fresher
    // than gossip, which can be a few intervals old (rounds only go up; unknown ids are ignored).
    // It counts as heard from (heard_from).
    void note_round(uint64_t node_id, uint64_t round, SteadyClock::time_point now);
    // The member's own digest, just merged, came from it (Member::heard): the first of its gossip
    // (its own comes first), its answer to a probe or a join. Unknown ids are ignored.
    void heard_from(uint64_t node_id, SteadyClock::time_point now);
    void set_address(const std::string& address);
    // A change raises this node's incarnation, so the new verdict supersedes the old one everywhere
    // (at one incarnation the table keeps what it heard first).
    void set_reachability(Reachability reachability);
    // This node's anchors (Member::anchors); a change raises its incarnation, as a probe of it
    // must go through the new ones at once.
    void set_anchors(std::vector<uint64_t> anchors);
    void leave();  // this node announces LEFT

    Member self() const;
    std::optional<Member> find(uint64_t node_id) const;
    std::optional<MemberState> state_of(uint64_t node_id) const;  // find's, without the copy
    std::optional<uint64_t> alive_round(uint64_t node_id) const;  // its round while ALIVE
    std::vector<Member> all() const;                              // self first, then the others
    std::vector<Member> reachable_others() const;  // ALIVE or SUSPECT: worth probing and gossiping
    // Up to k distinct reachable others other than `excluded`, drawn at random: in O(k) when they
    // are most of a large table, so one protocol period costs the same at any swarm size.
    std::vector<Member> sample_reachable(size_t k, uint64_t excluded, std::mt19937_64& rng) const;
    size_t others_count() const;  // every entry but this node's, gone ones included
    // Members a round may pair with: ALIVE and compatible (same fingerprint, protocol, swarm id),
    // self included.
    std::vector<uint64_t> pairable_ids() const;
    // Those of them, self included, that say members cannot dial them (not callable).
    std::vector<uint64_t> private_pairable_ids() const;
    // What pacing and the choice of a partner read of those members but self, in one pass (in
    // table order).
    std::vector<PairingFacts> pairable_facts() const;
    // The step times those members said, self included, leaving out those that said none yet.
    std::vector<double> pairable_step_seconds() const;
    bool compatible(const Member& member) const;

private:
    // A member as the table keeps it: what one run of it says of itself and never changes (its
    // address, key, model, ...) in a card that every table of this process shares for the same
    // run, beside what does change. The simulator holds thousands of tables of the same members,
    // so an entry is about 110 bytes rather than 450 (docs/scale.md).
    struct Card {
        uint64_t node_id = 0, instance = 0;
        uint32_t protocol_version = 0;
        std::string address, fingerprint, model, method, swarm_id;
        PublicKey public_key{};
        bool operator==(const Card&) const = default;
    };
    struct Entry {
        std::shared_ptr<const Card> card;
        uint64_t incarnation = 0, round = 0, paired_through = 0, solo_through = 0;
        double step_seconds = 0.0;
        SteadyClock::time_point since{}, heard{};
        MemberState state = MemberState::Alive;
        Reachability reachability = Reachability::Unknown;
        std::vector<uint64_t> anchors;
        bool compatible = false;  // compatible_card(*card), kept by track_locked
        uint64_t node_id() const { return card->node_id; }
    };
    static Member member_of(const Entry& entry);
    // `m` as an entry; its card is `card` when that says the same, else one shared (card_for).
    static Entry entry_of(const Member& m, const std::shared_ptr<const Card>& card);
    static std::shared_ptr<const Card> card_for(Card card);
    bool compatible_card(const Card& card) const;
    // ALIVE and compatible: what every pairable_* list keeps.
    bool pairable_locked(const Entry& e) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
    bool pairable_id_locked(uint64_t node_id) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
    bool compatible_with(std::string_view fingerprint, uint32_t protocol_version,
                         std::string_view swarm_id, std::string_view method) const;

    Merge merge_locked(const Member& incoming, SteadyClock::time_point now)
        ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
    Entry* find_locked(uint64_t node_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
    SteadyClock::duration suspicion_timeout_locked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
    // Keeps `timed_`, the entry's `compatible` and the sorted pairable view in step with the
    // member after any change of its state or card.
    void track_locked(Entry& entry) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
    void note_pairable_change_locked(uint64_t node_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
    // Brings `pairable_sorted_` up to date: rebuilt when stale, else the changed members merged in.
    void refresh_pairable_locked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
    void insert_locked(Entry entry) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
    void erase_locked(uint64_t node_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);

    MembershipLimits limits_;
    // self_'s fields that compatible() compares, which never change: it is called both with
    // mutex_ held and without, so it reads these copies rather than self_.
    const std::string fingerprint_;
    const uint32_t protocol_version_;
    const std::string swarm_id_;
    const std::string method_;
    mutable Mutex mutex_;
    Member self_ ABSL_GUARDED_BY(mutex_);
    // Dense, so a member is drawn at random in O(1); `index_` maps an id to its place.
    std::vector<Entry> others_ ABSL_GUARDED_BY(mutex_);
    absl::flat_hash_map<uint64_t, size_t> index_ ABSL_GUARDED_BY(mutex_);
    // The ids of members not ALIVE, the only ones expire() has to look at, at every protocol
    // period: a B-tree, as a std::set's scattered nodes made that walk a quarter of a
    // 10,000-node simulation.
    absl::btree_set<uint64_t> timed_ ABSL_GUARDED_BY(mutex_);
    // The pairable others' ids, sorted, as of the last refresh, and the members whose pairable
    // state may have changed since (stale: rebuild it all). Each choice of a partner and each
    // proposal answered reads the sorted view, and sorting 10,000 ids each time was a third of a
    // 10,000-node simulation; members change between two reads by a few at a time.
    mutable std::vector<uint64_t> pairable_sorted_ ABSL_GUARDED_BY(mutex_);
    mutable std::vector<uint64_t> pairable_changed_ ABSL_GUARDED_BY(mutex_);
    mutable bool pairable_stale_ ABSL_GUARDED_BY(mutex_) = true;
    // Id -> incarnation, when; and when each was made, oldest first, so that expire() drops the
    // old ones from the front where it walked every tombstone at every period (hundreds a table
    // at 10,000 nodes, and a growing share of a simulation's time).
    std::unordered_map<uint64_t, std::pair<uint64_t, SteadyClock::time_point>> tombstones_
        ABSL_GUARDED_BY(mutex_);
    std::deque<std::pair<SteadyClock::time_point, uint64_t>> burials_ ABSL_GUARDED_BY(mutex_);
};

}  // namespace starling
