// Pacing: how long an inner phase is when [swarm].round_seconds leaves it to the swarm
// (docs/uneven.md), and how many steps a node takes in it. Pure functions of what the members
// gossip, shared by starlingd (daemon/swarm/swarm_node.h) and the simulator (sim/):
// rounds of H steps while the members train at about the same speed, which is how the methods were
// studied and keeps equal shares bit for bit; a time budget once they differ, so that the fast ones
// need not wait for the slow ones nor leave them out of the averaging.
#pragma once

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

// Where a node stands against the swarm before each round (starlingd's NodeRunner, and the
// simulator, decide from these): the median round of the compatible members other than this
// node (none when there are none)...
std::optional<uint64_t> median_round(std::span<const PairingFacts> others);

// ...what a node does when that median is more than max_round_gap ahead, where it can never pair
// again: nothing when it is not; go on from the median round with its own state when a state copy
// cost more rounds last time (copy_cost_rounds) than it is behind; else copy the state.
enum class CatchUp { None, Skip, Copy };
CatchUp catch_up(std::optional<uint64_t> median, uint64_t round, uint64_t max_round_gap,
                 std::optional<uint64_t> copy_cost_rounds);

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
