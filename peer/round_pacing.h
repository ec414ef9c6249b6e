// Pacing: how long an inner phase is when [swarm].round_seconds leaves it to the swarm
// (docs/uneven.md), and how many steps a node takes in it. Pure functions of what the members
// gossip, shared by starlingd (daemon/swarm/swarm_node.h) and the simulator (sim/):
// rounds of H steps while the members train at about the same speed, which is how the methods were
// studied and keeps equal shares bit for bit; a time budget once they differ, so that the fast ones
// need not wait for the slow ones nor leave them out of the averaging.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <optional>
#include <span>
#include <vector>

#include "peer/membership.h"

namespace starling {

// The time budget for an inner phase, from the step times the pairable members said (self
// included): 0, for rounds of H steps, when fewer than two said one or the slowest is within
// `uneven_margin` of the fastest (slowest <= (1 + uneven_margin) x fastest); else H times their
// median (the mean of the middle two for an even count), so that a member of median speed still
// takes H steps and each other one what fits the same time. Rounds that have a budget already
// (`budget_now`) keep one until the spread is within half the margin: step times measured on busy
// boxes wander, and a swarm near the margin would otherwise switch back and forth every few rounds.
double automatic_round_seconds(std::vector<double> step_seconds, int inner_steps,
                               double uneven_margin, bool budget_now);

// The inner steps of a phase: H without a budget (or before the node knows its step time), else
// what fits the budget at the node's step time, at least 1 and at most 16 H.
int phase_steps_in(double budget, double step_seconds, int inner_steps);

// The members pacing reads (the medians and slower_in_reach below): those heard from first hand
// (PairingFacts::heard) within `window_s` before `now`, at least 2 s; when fewer than
// kMinHeardLately were, the kMinHeardLately heard most lately; when fewer than that were ever
// heard, or there are no more than that, all of them. Past the digests that travel whole in a
// small swarm's gossip (peer/swim.h) a member's round is refreshed by a random draw every N / 60
// seconds or so: at 1,000 simulated nodes a view was a round stale, a joiner's median two rounds
// behind, and a node before each phase waited for hundreds of members that its view listed as a
// round behind and that had moved on, asking them 8 at a time (docs/scale.md). Nodes pass on
// their own digest first in every gossip and answer probes with it, so a node hears from a few
// members a second at any size, each as of then.
inline constexpr size_t kMinHeardLately = 8;
std::vector<PairingFacts> heard_lately(std::span<const PairingFacts> others,
                                       SteadyClock::time_point now, double window_s);
// The same rule as a time: members heard from at or after it are those heard_lately keeps, for a
// window that began at `since` (time_point::min(): all of them).
SteadyClock::time_point heard_lately_since(std::span<const PairingFacts> others,
                                           SteadyClock::time_point since);

// Where a node stands against the swarm before each round (starlingd's NodeRunner, and the
// simulator, decide from these): the median round of the compatible members other than this
// node (none when there are none)...
std::optional<uint64_t> median_round(std::span<const PairingFacts> others);

// ...or of the rounds they train (median_training_round): a member that pairs advertises the
// round it last began to choose a partner for and trains the one after it beside that choice, so
// once its digest says it chose for its round (paired or solo) it trains the next; before (a
// fresh member, one that skipped to its round, or one choosing now) it is counted at its round.
// Counting a member choosing now a round low only ever makes a node look less behind...
uint64_t training_round(const PairingFacts& m);
std::optional<uint64_t> median_training_round(std::span<const PairingFacts> others);

// ...what a node at `position` does when that median is ahead of it (both in the same terms: the
// advertised rounds and this node's round, or the trained ones): nothing when it is not; past
// max_round_gap behind, where it can never pair again, go on from the median round with its own
// state when a state copy cost more rounds last time (copy_cost_rounds) than it is behind, else
// copy the state. Behind by max_round_gap or less, a node that `pairs` (NoLoCo) goes on from the
// median round too: each of its choices would come after the others are done with that round and
// it would go solo round after round (the simulator found nodes a round behind for tens of
// rounds, the swarm no longer waiting for them), where a round of its own training costs little.
enum class CatchUp { None, Skip, Copy };
CatchUp catch_up(std::optional<uint64_t> median, uint64_t position, uint64_t max_round_gap,
                 std::optional<uint64_t> copy_cost_rounds, bool pairs);

// ...where a node goes on from after a state copy that landed at round `copied` (none: from there):
// one that pairs, from the round after the median (median_training_round) when the copy is not
// past that already. It then waits for the members to choose their partners for the median round
// (ahead_of_all, slower_in_reach) and starts its first phase with them, so that its first choice
// meets theirs; one that went on from the median round trained its first phase from wherever the
// swarm was in theirs, came late to that choice and went solo, and the swarm waited for it before
// the next phase (the simulator, 100 nodes: joiners paired in their second or third choice, rounds
// 16 s long in the median for phases of 12.4 s, 14 s with this rule). One that does not pair, from
// the median when it is more than max_round_gap ahead (catch_up)...
std::optional<uint64_t> round_after_copy(std::optional<uint64_t> median, uint64_t copied,
                                         uint64_t max_round_gap, bool pairs);

// ...whether it is ahead of every member by more than max_round_gap (it then waits, up to
// pace_timeout_s, for one to come within reach instead of running on alone)...
bool ahead_of_all(std::span<const PairingFacts> others, uint64_t round, uint64_t max_round_gap);

// ...and, before it trains round `training`, the members within max_round_gap of training - 1
// that have not chosen a partner for it yet (they advertise the round they last chose for): with
// NoLoCo it waits for them, at most kSlowerWaitPhases of its own inner phases.
inline constexpr double kSlowerWaitPhases = 2.0;
std::vector<uint64_t> slower_in_reach(std::span<const PairingFacts> others, uint64_t training,
                                      uint64_t max_round_gap);
// Whether a member that says `round` is one of them.
bool is_slower_in_reach(uint64_t round, uint64_t training, uint64_t max_round_gap);

// While it waits, the node asks those members for their rounds directly (a Ping each; gossip
// would bring the news a protocol period late), once every this long: a hundredth of its own inner
// phase, at least 10 ms and at most 250 ms. A wait loses half an interval of training on average
// (0.5% of the phase at most), and a swarm waiting for one member asks it at most 4 times a second
// each: asked as fast as round trips allowed (every 10 ms on loopback), 16 daemons sent 11.6 kB
// of membership payload per node and second where 6.8 were predicted (bench/swarm_scale).
double slower_refresh_seconds(double phase_seconds);

// Each time, it asks at most kRefreshFanout of them: those it asked longest ago, never asked
// first, in the order given. What a wait costs then stays flat in the size of the swarm, where
// asking every slower member each time cost O(N) Pings a node and interval, each on a thread of
// its own (up to 127 per refresh at 128 daemons); the rounds of the ones not asked come by gossip
// meanwhile. Eight, not fewer: in the simulator (40 nodes, seed 3) asking 3 at a time
// doubled the median wait before a phase (0.35 s to 0.75 s) and made rounds 8% longer, where 8
// kept both as they were.
inline constexpr size_t kRefreshFanout = 8;

// One wait for the members slower when it began. A member found no longer slower is dropped for
// good (rounds only go up). Each refresh and each check looks at the members at the front of the
// queue only, up to the first still slower: the whole wait costs O(S) looks for S slower members,
// where looking at every one at each refresh cost O(S) a refresh, and thousands of nodes waiting
// for thousands of members made the simulator quadratic in N.
class SlowerWait {
public:
    using StillSlower = std::function<bool(uint64_t node_id)>;
    SlowerWait() = default;
    explicit SlowerWait(const std::vector<uint64_t>& slower);
    // The members to ask this time, out of those `still_slower`, counted as asked now.
    std::vector<uint64_t> next(const StillSlower& still_slower);
    // Whether no member it waits for is still slower.
    bool over(const StillSlower& still_slower);

private:
    std::deque<uint64_t> queue_;  // the front was asked longest ago, or never
};

}  // namespace starling
