#include "engine/overlap.h"

#include <algorithm>

#include "optimizer/outer_round.h"

namespace starling {

void solo_outer_start(const EngineConfig& config, Replica& replica, std::span<const float> theta,
                      std::span<float> start, std::span<float> momentum, std::span<float> scratch_a,
                      std::span<float> scratch_b) {
    std::copy(replica.phi().begin(), replica.phi().end(), start.begin());
    std::copy(replica.momentum().begin(), replica.momentum().end(), momentum.begin());
    if (config.method == OuterMethod::DiLoCo) {
        const std::span<const float> own = replica.displacement();
        diloco_outer_step(config.outer, {&own, 1}, start, momentum, scratch_a);
        return;
    }
    const bool split = config.exchange.mode == MessageMode::Split;
    const MemberValues own{
        .node_id = replica.node_id(),
        .values = split ? replica.displacement() : theta,
        .phi = split ? std::span<const float>(replica.phi()) : std::span<const float>()};
    PartnerChecks unused;  // consulted for partners' messages only
    noloco_outer_step(config.outer, config.exchange.mode, own, {}, unused, start, momentum,
                      scratch_a, scratch_b);
}

}  // namespace starling
