// How long an inner phase is when [swarm].round_seconds leaves it to the swarm (docs/uneven.md):
// rounds of H steps while the members train at about the same speed, which is how the methods were
// studied and keeps equal shares bit for bit; a time budget once they differ, so that the fast ones
// need not wait for the slow ones nor leave them out of the averaging.
#pragma once

#include <vector>

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

}  // namespace starling
