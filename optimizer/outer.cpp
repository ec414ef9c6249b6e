#include "optimizer/outer.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "common/error.h"
#include "kernels/math.h"

namespace starling {

namespace {

void check_sizes(std::span<float> phi, std::span<float> delta, std::span<const float> input,
                 const char* what) {
    if (delta.size() != phi.size() || input.size() != phi.size()) {
        throw Error(std::string("outer step: ") + what + " has " + std::to_string(input.size()) +
                    " elements, phi " + std::to_string(phi.size()) + ", momentum " +
                    std::to_string(delta.size()));
    }
}

}  // namespace

std::string_view momentum_form_name(MomentumForm form) {
    return form == MomentumForm::Nesterov ? "nesterov" : "heavyball";
}

MomentumForm momentum_form_from_name(std::string_view name) {
    if (name == "heavyball") return MomentumForm::HeavyBall;
    if (name == "nesterov") return MomentumForm::Nesterov;
    throw Error("outer momentum form \"" + std::string(name) +
                "\" is not known (use \"heavyball\" or \"nesterov\")");
}

void OuterConfig::validate() const {
    if (!(momentum >= 0.0f && momentum < 1.0f)) throw Error("outer: momentum must be in [0, 1)");
    if (!(lr > 0.0f && std::isfinite(lr))) throw Error("outer: lr must be positive");
    if (!(pull >= 0.0f && std::isfinite(pull))) throw Error("outer: pull must not be negative");
}

void group_mean(std::span<float> out, std::span<const std::span<const float>> members,
                std::span<const double> weights) {
    if (members.empty()) throw Error("group mean of no members");
    for (const auto& m : members) {
        if (m.size() != out.size()) throw Error("group mean: members differ in size");
    }
    if (!weights.empty() && weights.size() != members.size())
        throw Error("group mean: " + std::to_string(weights.size()) + " weights for " +
                    std::to_string(members.size()) + " members");
    double total = 0.0;
    for (const double w : weights) {
        if (!(w > 0.0) || !std::isfinite(w)) throw Error("group mean: a weight is not positive");
        total += w;
    }
    const bool equal =
        std::all_of(weights.begin(), weights.end(), [&](double w) { return w == weights.front(); });
    const std::ptrdiff_t n = static_cast<std::ptrdiff_t>(out.size());
    if (equal) {
        const float inv = 1.0f / static_cast<float>(members.size());
#pragma omp parallel for schedule(static)
        for (std::ptrdiff_t i = 0; i < n; i++) {
            float sum = members[0][i];
            for (size_t k = 1; k < members.size(); k++) sum += members[k][i];
            out[i] = sum * inv;
        }
        return;
    }
    std::vector<float> share(members.size());
    for (size_t k = 0; k < members.size(); k++) share[k] = static_cast<float>(weights[k] / total);
    weighted_sum(out, members, share);
}

void weighted_sum(std::span<float> out, std::span<const std::span<const float>> members,
                  std::span<const float> shares) {
    if (members.empty() || shares.size() != members.size())
        throw Error("weighted sum: " + std::to_string(shares.size()) + " shares for " +
                    std::to_string(members.size()) + " members");
    for (const auto& m : members) {
        if (m.size() != out.size()) throw Error("weighted sum: members differ in size");
    }
    const std::ptrdiff_t n = static_cast<std::ptrdiff_t>(out.size());
#pragma omp parallel for schedule(static)
    for (std::ptrdiff_t i = 0; i < n; i++) {
        float sum = shares[0] * members[0][i];
        for (size_t k = 1; k < members.size(); k++) sum += shares[k] * members[k][i];
        out[i] = sum;
    }
}

void outer_step(const OuterConfig& config, std::span<float> phi, std::span<float> delta,
                std::span<const float> mean_displacement, std::span<const float> mean_phi) {
    check_sizes(phi, delta, mean_displacement, "the mean displacement");
    if (!mean_phi.empty()) check_sizes(phi, delta, mean_phi, "the mean phi");
    const bool nesterov = config.form == MomentumForm::Nesterov;
    const float lr = config.lr, pull = config.pull, momentum = config.momentum;
    const std::ptrdiff_t n = static_cast<std::ptrdiff_t>(phi.size());
    if (mean_phi.empty()) {
#pragma omp parallel for schedule(static)
        for (std::ptrdiff_t i = 0; i < n; i++) {
            outer_element(phi[i], delta[i], lr * mean_displacement[i], momentum, nesterov);
        }
    } else {
#pragma omp parallel for schedule(static)
        for (std::ptrdiff_t i = 0; i < n; i++) {
            const float g = lr * mean_displacement[i] - pull * (phi[i] - mean_phi[i]);
            outer_element(phi[i], delta[i], g, momentum, nesterov);
        }
    }
}

void outer_step_towards(const OuterConfig& config, std::span<float> phi, std::span<float> delta,
                        std::span<const float> mean_theta) {
    check_sizes(phi, delta, mean_theta, "the mean theta");
    const bool nesterov = config.form == MomentumForm::Nesterov;
    const float lr = config.lr, momentum = config.momentum;
    const std::ptrdiff_t n = static_cast<std::ptrdiff_t>(phi.size());
#pragma omp parallel for schedule(static)
    for (std::ptrdiff_t i = 0; i < n; i++) {
        outer_element(phi[i], delta[i], lr * (mean_theta[i] - phi[i]), momentum, nesterov);
    }
}

}  // namespace starling
