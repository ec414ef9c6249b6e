#include "optimizer/outer_round.h"

#include <algorithm>
#include <cmath>
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

// The middle value, the lower of the two middle ones for an even count.
double lower_median(std::vector<double> values) {
    std::sort(values.begin(), values.end());
    return values[(values.size() - 1) / 2];
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
    // This node's own update, D = theta - phi, sets the scale a partner's message is judged on.
    const double own_update =
        fused ? euclidean_distance(self.values, phi) : euclidean_distance(self.values, {});
    for (const MemberValues& p : partners) {
        std::optional<std::string> problem =
            fused ? checks.state.check(p.values, self.values, own_update)
                  : checks.delta.check(p.values, self.values, own_update);
        if (!problem && !fused) problem = checks.state.check(p.phi, self.phi, own_update);
        if (problem) {
            result.refused.push_back({p.node_id, partner_name(p.node_id) + ": " + *problem});
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
        weights.push_back(std::min(m->weight, kMaxTokenRatio * self.weight));
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

DiLoCoStep diloco_outer_step(const OuterConfig& config,
                             std::span<const std::span<const float>> decoded, std::span<float> phi,
                             std::span<float> momentum, std::span<float> scratch,
                             std::span<const double> weights) {
    if (!weights.empty() && weights.size() != decoded.size())
        throw Error("DiLoCo step: " + std::to_string(weights.size()) + " weights for " +
                    std::to_string(decoded.size()) + " members");
    for (const double w : weights)
        if (!(w > 0.0) || !std::isfinite(w)) throw Error("DiLoCo step: a weight is not positive");
    DiLoCoStep result;
    std::vector<size_t> kept;
    std::vector<double> norms(decoded.size());
    for (size_t k = 0; k < decoded.size(); k++) {
        // Float values give a finite sum of squares in double: the norm is finite exactly when
        // every value is.
        norms[k] = euclidean_distance(decoded[k], {});
        (std::isfinite(norms[k]) ? kept : result.not_finite).push_back(k);
    }
    if (kept.empty()) return result;

    std::vector<std::span<const float>> members;
    std::vector<double> kept_weights;
    for (const size_t k : kept) {
        members.push_back(decoded[k]);
        kept_weights.push_back(weights.empty() ? 1.0 : weights[k]);
    }
    const double weight_cap = kMaxTokenRatio * lower_median(kept_weights);
    for (double& w : kept_weights) w = std::min(w, weight_cap);
    // A member that trained more tokens than the median one may send a D of a proportionally
    // larger norm (an honest one sends less: its steps partly cancel); the rest are held to the
    // median norm. With equal weights every D is held to the median norm.
    const double median_weight = lower_median(kept_weights);
    std::vector<double> kept_norms;
    for (const size_t k : kept) kept_norms.push_back(norms[k]);
    const double median_norm = lower_median(kept_norms);
    std::vector<double> scales;
    for (size_t m = 0; m < members.size(); m++) {
        const double allowed = median_norm * std::max(1.0, kept_weights[m] / median_weight);
        const bool clip = kept_norms[m] > allowed;
        scales.push_back(clip ? allowed / kept_norms[m] : 1.0);
        if (clip) result.clipped.push_back(kept[m]);
    }
    result.members = static_cast<int>(members.size());
    if (result.clipped.empty()) {
        group_mean(scratch, members, weights.empty() ? std::span<const double>() : kept_weights);
    } else {
        double total = 0.0;
        for (const double w : kept_weights) total += w;
        std::vector<float> shares;
        for (size_t m = 0; m < members.size(); m++)
            shares.push_back(static_cast<float>(kept_weights[m] * scales[m] / total));
        weighted_sum(scratch, members, shares);
    }
    outer_step(config, phi, momentum, scratch, {});
    return result;
}

}  // namespace starling
