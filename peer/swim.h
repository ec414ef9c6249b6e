// SWIM's decisions without I/O: which member to probe each period, whom to ask for an indirect
// probe, whom to gossip with and which digests to send, and what a failed probe or an arriving
// digest does to the member table. The caller owns the clock, the transport and the seed of the
// randomness: MembershipProtocol runs it over gRPC, the simulator (sim/) over a simulated network,
// so both run the same protocol code.
//
// Dissemination: a view of up to `full_view_max` members travels whole in every gossip (a small
// swarm's rounds and choices of partner reach every member at once). Past that a message holds at
// most `digests_max` digests, so its size is flat in the swarm's size: this node's own, then the
// members whose state or incarnation changed lately, each sent retransmit_factor * ceil(log2(N+1))
// times (SWIM's infection-style dissemination, which reaches all N with high probability), the
// freshest first, and the rest drawn at random (anti-entropy for what an epidemic missed, and for
// the fields that change every round).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <chrono>
#include <random>
#include <set>
#include <utility>
#include <vector>

#include <absl/container/flat_hash_map.h>

#include "common/mutex.h"
#include "peer/membership.h"

namespace starling {

struct SwimSettings {
    int indirect_probes = 3;  // k: members asked to probe a target that missed a direct probe
    size_t full_view_max = 64;
    size_t digests_max = 32;
    int retransmit_factor = 3;  // SWIM's lambda
    // A member alive for less than this whose reachability is still unknown is not probed yet: a
    // joiner behind NAT learns it is private, and names the anchors to probe it through, within
    // two dial-backs and a gossip or two; a ping of its address before then fails, and in a small
    // swarm the suspicion that follows could declare it dead before its verdict is known.
    std::chrono::milliseconds unknown_grace{10000};
    // A private member whose digest here names no anchors yet, learnt less than this long ago, is
    // not probed: only its anchors can reach it, so the probe would ask nobody and fail, and
    // suspect a member this node merely knows too little of. A private node says it is private a
    // moment before it names its anchors, and when many change at once the second digest can
    // take a minute to spread (1,000 simulated nodes, half of them private, starting together:
    // 30 to 53 s), during which such probes made over 1,000 false suspicions in 300 s. Past the
    // grace one that still names none is probed as any other and, failing, suspected: a node
    // that died before naming its anchors is still found.
    std::chrono::milliseconds anchorless_grace{60000};
};

class SwimCore {
public:
    SwimCore(Member self, MembershipLimits limits, SwimSettings settings, uint64_t seed);

    MemberTable& table() { return table_; }
    const MemberTable& table() const { return table_; }

    // What one protocol period does, after the expiries it applied itself.
    struct Period {
        std::vector<uint64_t> declared_dead;
        std::optional<Member> probe;   // ping this member (a round robin over a shuffled order)
        std::optional<Member> gossip;  // push-pull with this one, drawn at random
    };
    Period tick(SteadyClock::time_point now);
    // Whether a probe of `target` pings it at all: not a private member (callable) unless this
    // node is one of its anchors, which reaches it over the stream the member keeps open.
    bool direct_probe(const Member& target) const;
    // Members to probe `target` indirectly: a private member's anchors that this table holds
    // alive or suspect, as only they can reach it; for any other target up to k callable
    // members other than it, at random.
    std::vector<Member> indirect_helpers(uint64_t target);
    // The direct and indirect probes of `target` failed. True when that made it SUSPECT: the
    // caller then gossips with it in place of the period's partner (when it is callable), so a
    // member that lives (a slow path, a short freeze) hears the suspicion first hand and its answer
    // carries the refutation back at once, not a dissemination later, when others may have
    // declared it dead.
    bool probe_failed(uint64_t target, SteadyClock::time_point now);
    // Merges a digest that arrived; a change of state or incarnation is passed on in later gossip.
    MemberTable::Merge merge(const Member& incoming, SteadyClock::time_point now);
    // The digests of one gossip message (a request or its answer), this node's first.
    std::vector<Member> gossip_payload();

    // A direct probe of `member` was answered after `round_trip`.
    void acked(uint64_t member, SteadyClock::duration round_trip);
    // How long a probe of `member` waits for its answer: TCP's retransmission timeout over the
    // round trips its acks took (RFC 6298: smoothed round trip + 4 x its variation), at least
    // `base` (the configured probe timeout; also what a member never answered yet gets) and at
    // most kProbeTimeoutCeiling x base. A member far away or slow to answer (a busy box) gets the
    // time it takes rather than a suspicion at every probe (4.3-6.7 per node-day at 1% loss with
    // 5% of members 300 ms slow, simulated); a member that stops answering is still suspected
    // within the ceiling.
    // That timeout is then multiplied by 1 + this node's local health (below).
    static constexpr int kProbeTimeoutCeiling = 4;
    std::chrono::milliseconds probe_timeout_for(uint64_t member,
                                                std::chrono::milliseconds base) const;
    // Lifeguard's local health multiplier (Dadgar et al., DSN 2018): a node whose probes fail and
    // whom others suspect is more likely slow itself (a busy box, a starved process) than among
    // dead members, and its own timeouts are what fire falsely. Each probe that failed and each
    // suspicion of this node that it refuted count it up, to at most kMaxLocalHealth; each
    // answered probe counts it down, to 0 on a healthy node. A starved node's suspicions thereby
    // wait up to nine times as long, where every late answer would otherwise suspect a live member
    // and the indirect probes and refutations that follow load the box further.
    static constexpr int kMaxLocalHealth = 8;
    int local_health() const;
    // The smoothed round trip of this node's answered probes of `member`; nullopt before one.
    std::optional<double> round_trip_ms(uint64_t member) const;

private:
    void spread(uint64_t node_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
    // 0 or less ends the member's news.
    void set_sends_left(uint64_t node_id, int left) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
    // One more sign that this node itself is slow: local_health up by one, to the cap.
    void count_against_local_health();
    // Up to k reachable members other than `excluded` that a call can reach, at random. Draws as
    // sample_reachable does, then again for the places private members took: a swarm with none
    // draws exactly what it always did.
    std::vector<Member> sample_callable(size_t k, uint64_t excluded)
        ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);

    const SwimSettings settings_;
    MemberTable table_;
    mutable Mutex mutex_;
    std::mt19937_64 rng_ ABSL_GUARDED_BY(mutex_);
    // Members whose news is still being passed on: id -> sends left, and the same in the order
    // gossip takes them (most sends left, then the lower id), so that a gossip reads only the
    // news it sends: at thousands of members a gossip that sorted every piece pending spent a
    // third of a simulated swarm's time.
    absl::flat_hash_map<uint64_t, int> sends_left_ ABSL_GUARDED_BY(mutex_);
    std::set<std::pair<int, uint64_t>> news_order_ ABSL_GUARDED_BY(mutex_);  // (-sends left, id)
    // Per member answered: the smoothed round trip and its variation, in milliseconds.
    struct RoundTrip {
        double smoothed = 0, variation = 0;
    };
    absl::flat_hash_map<uint64_t, RoundTrip> round_trips_ ABSL_GUARDED_BY(mutex_);
    int local_health_ ABSL_GUARDED_BY(mutex_) = 0;
    // The protocol thread's alone (tick).
    std::vector<uint64_t> probe_order_;
    size_t probe_next_ = 0;
};

}  // namespace starling
