#include "optimizer/outer_round.h"

#include <algorithm>
#include <cstdio>
#include <optional>

#include "common/error.h"

namespace starling {

namespace {

std::string partner_name(uint64_t node_id) {
    char buffer[32];
    std::snprintf(buffer, sizeof buffer, "partner %016llx",
                  static_cast<unsigned long long>(node_id));
    return buffer;
}

}  // namespace

std::string_view message_mode_name(MessageMode mode) {
    return mode == MessageMode::Split ? "split" : "fused";
}

MessageMode message_mode_from_name(std::string_view name) {
    if (name == "fused") return MessageMode::Fused;
    if (name == "split") return MessageMode::Split;
    throw Error("message mode \"" + std::string(name) + "\" is not known (fused, split)");
}

NoLoCoStep noloco_outer_step(const OuterConfig& config, MessageMode mode, const MemberValues& self,
                             std::span<const MemberValues> partners, PartnerChecks& checks,
                             std::span<float> phi, std::span<float> momentum,
                             std::span<float> scratch_a, std::span<float> scratch_b) {
    const bool fused = mode == MessageMode::Fused;
    std::vector<const MemberValues*> members{&self};
    NoLoCoStep result;
    for (const MemberValues& p : partners) {
        std::optional<std::string> problem = fused ? checks.state.check(p.values, self.values)
                                                   : checks.delta.check(p.values, self.values);
        if (!problem && !fused) problem = checks.state.check(p.phi, self.phi);
        if (problem) {
            result.refused.push_back(partner_name(p.node_id) + ": " + *problem);
            continue;
        }
        members.push_back(&p);
    }
    std::sort(members.begin(), members.end(),
              [](const MemberValues* a, const MemberValues* b) { return a->node_id < b->node_id; });
    result.members = static_cast<int>(members.size());
    if (members.size() < 2) {
        if (fused) {
            outer_step_towards(config, phi, momentum, self.values);
        } else {
            outer_step(config, phi, momentum, self.values, {});
        }
        return result;
    }
    std::vector<std::span<const float>> values, phis;
    std::vector<double> weights;
    for (const MemberValues* m : members) {
        values.push_back(m->values);
        phis.push_back(m->phi);
        weights.push_back(m->weight);
    }
    group_mean(scratch_a, values, weights);
    if (fused) {
        outer_step_towards(config, phi, momentum, scratch_a);
    } else {
        group_mean(scratch_b, phis, weights);
        outer_step(config, phi, momentum, scratch_a, scratch_b);
    }
    return result;
}

void diloco_outer_step(const OuterConfig& config, std::span<const std::span<const float>> decoded,
                       std::span<float> phi, std::span<float> momentum, std::span<float> scratch,
                       std::span<const double> weights) {
    group_mean(scratch, decoded, weights);
    outer_step(config, phi, momentum, scratch, {});
}

}  // namespace starling
