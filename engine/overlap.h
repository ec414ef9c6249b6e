// Overlapped rounds (docs/overlap.md): while round r's exchange runs, round r + 1 trains from the
// phi a solo outer step gives (this replica's values alone), and the exchange's outer step lands
// as a rebase from there: theta = phi_{r+1} + (theta - start). Training meanwhile starts from a
// point that differs from phi_{r+1} only by the partners' share of the step, not by the whole
// outer step, so the steps taken before the landing are nearly those a sequential round takes.
#pragma once

#include <span>

#include "engine/config.h"
#include "engine/replica.h"

namespace starling {

// The solo outer step of `replica` on copies: start = its phi stepped with its own values only
// (theta, the round's end, for fused NoLoCo; D for split NoLoCo and DiLoCo, which must be
// current), momentum = its outer momentum stepped alike. The replica is unchanged. Every span
// holds replica.size() floats.
void solo_outer_start(const EngineConfig& config, Replica& replica, std::span<const float> theta,
                      std::span<float> start, std::span<float> momentum, std::span<float> scratch_a,
                      std::span<float> scratch_b);

}  // namespace starling
