#include "optimizer/outer_round.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <numeric>
#include <optional>
#include <unordered_set>

#include "common/error.h"
#include "common/random.h"

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

// A member's weights: theta as sent (fused), or phi + D into `scratch` (split), with `own_phi`
// where the member's message carries no phi (a round without the pull).
std::span<const float> theta_of(const MemberValues& m, bool fused, std::span<const float> own_phi,
                                std::span<float> scratch) {
    if (fused) return m.values;
    const std::span<const float> phi = m.phi.empty() ? own_phi : m.phi;
    for (size_t i = 0; i < scratch.size(); i++) scratch[i] = phi[i] + m.values[i];
    return scratch;
}

std::string worse_on_held_out(double loss, double own_loss) {
    char text[160];
    std::snprintf(text, sizeof text,
                  "its weights score %.4f on a held-out batch, more than %g times this node's "
                  "own %.4f",
                  loss, kMaxHeldOutLossRatio, own_loss);
    return text;
}

// Why this node can judge no partner, if its own values are broken: a diverged node would
// otherwise refuse every honest message and quarantine its authors.
std::optional<std::string> own_values_broken(std::span<const float> values,
                                             std::span<const float> phi) {
    if (const auto i = first_non_finite(values))
        return "this node's own value " + std::to_string(*i) + " is not finite";
    if (const auto i = first_non_finite(phi))
        return "this node's own phi value " + std::to_string(*i) + " is not finite";
    return std::nullopt;
}

// Each member's cosine with the others' sum (shares[m] members[m] each; 0 where either is zero)
// and, where `momentum_norm` is positive, with the momentum (NaN otherwise, and for a D of zero:
// it points nowhere). Leaves the sum of all in `scratch`.
struct Alignments {
    std::vector<double> with_others, with_momentum;
};
Alignments alignments(std::span<const std::span<const float>> members,
                      std::span<const float> shares, std::span<const double> norms,
                      std::span<const float> momentum, double momentum_norm,
                      std::span<float> scratch) {
    weighted_sum(scratch, members, shares);
    Alignments result;
    for (size_t m = 0; m < members.size(); m++) {
        const std::span<const float> d = members[m];
        double dot = 0.0, others_squared = 0.0, momentum_dot = 0.0;
        for (size_t i = 0; i < d.size(); i++) {
            const double others = static_cast<double>(scratch[i]) - double(shares[m]) * d[i];
            dot += others * d[i];
            others_squared += others * others;
            momentum_dot += double(momentum[i]) * d[i];
        }
        const double norm_product = std::sqrt(others_squared) * norms[m];
        result.with_others.push_back(norm_product > 0.0 ? dot / norm_product : 0.0);
        result.with_momentum.push_back(momentum_norm > 0.0 && norms[m] > 0.0
                                           ? momentum_dot / (momentum_norm * norms[m])
                                           : std::numeric_limits<double>::quiet_NaN());
    }
    return result;
}

// A fused partner's update and this node's own at the round's sampled coordinates: theta - phi
// from the partner's update sample, and from this node's exact values.
struct SampledUpdates {
    std::vector<float> partner, own;
};
SampledUpdates sampled_updates(const MemberValues& p, const MemberValues& self,
                               std::span<const float> phi, std::span<const uint64_t> at) {
    SampledUpdates d;
    d.partner.reserve(at.size());
    d.own.reserve(at.size());
    for (size_t j = 0; j < at.size(); j++) {
        d.partner.push_back(p.sample_theta[j] - p.sample_phi[j]);
        d.own.push_back(self.values[at[j]] - phi[at[j]]);
    }
    return d;
}

// Why a partner's update sample cannot be read: values that are not finite, or a theta further
// from the partner's decoded theta than the codec's rounding takes it.
std::optional<std::string> unreadable_sample(const MemberValues& p, std::span<const uint64_t> at) {
    if (p.sample_theta.size() != at.size() || p.sample_phi.size() != at.size() ||
        p.sample_rounding.size() != at.size())
        throw Error("NoLoCo step: an update sample of " + std::to_string(p.sample_theta.size()) +
                    " values for " + std::to_string(at.size()) + " coordinates");
    if (const auto i = first_non_finite(p.sample_theta))
        return "its update sample's theta value " + std::to_string(*i) + " is not finite";
    if (const auto i = first_non_finite(p.sample_phi))
        return "its update sample's phi value " + std::to_string(*i) + " is not finite";
    for (size_t j = 0; j < at.size(); j++) {
        const float apart = std::abs(p.values[at[j]] - p.sample_theta[j]);
        if (!(apart <= p.sample_rounding[j])) {
            char text[224];
            std::snprintf(text, sizeof text,
                          "its update sample's theta at coordinate %llu is %g where its message "
                          "decodes to %g, %g apart, past the codec's rounding (%g): the sample is "
                          "not of the theta it sent",
                          static_cast<unsigned long long>(at[j]), p.sample_theta[j],
                          p.values[at[j]], apart, p.sample_rounding[j]);
            return std::string(text);
        }
    }
    return std::nullopt;
}

}  // namespace

std::vector<uint64_t> sample_coordinates(uint64_t round, uint64_t size, uint64_t count) {
    std::vector<uint64_t> at;
    if (count >= size) {
        at.resize(size);
        std::iota(at.begin(), at.end(), uint64_t{0});
        return at;
    }
    // Floyd's sampling: each j from size - count up adds a uniform draw from [0, j], or j itself
    // where the draw was taken already; every subset of `count` comes out equally likely.
    constexpr uint64_t kSampleSalt = 0x7570'645f'7361'6d70;  // "upd_samp"
    const uint64_t seed = hash_index(kSampleSalt, round);
    std::unordered_set<uint64_t> taken;
    taken.reserve(count);
    for (uint64_t j = size - count; j < size; j++) {
        const uint64_t draw = hash_index(seed, j) % (j + 1);
        taken.insert(taken.contains(draw) ? j : draw);
    }
    at.assign(taken.begin(), taken.end());
    std::sort(at.begin(), at.end());
    return at;
}

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
    std::optional<double> own_loss;  // on the held-out batch, once a partner is scored
    // This node's own update, D = theta - phi, sets the scale a partner's message is judged on.
    const double own_update =
        fused ? euclidean_distance(self.values, phi) : euclidean_distance(self.values, {});
    result.held_out_ratios.assign(partners.size(), std::numeric_limits<double>::quiet_NaN());
    std::optional<std::string> own_fault;
    if (checks.judge) own_fault = own_values_broken(self.values, phi);
    auto leave_out_unjudged = [&](const MemberValues& p) {
        result.refused.push_back(
            {p.node_id, partner_name(p.node_id) + ": not judged: " + *own_fault, true});
    };
    for (size_t k = 0; k < partners.size(); k++) {
        const MemberValues& p = partners[k];
        if (!checks.judge) {
            members.push_back(&p);
            continue;
        }
        if (own_fault) {
            leave_out_unjudged(p);
            continue;
        }
        std::optional<std::string> problem =
            fused ? checks.state.check(p.values, self.values, own_update)
                  : checks.delta.check(p.values, self.values, own_update);
        if (!problem && !fused && !p.phi.empty())
            problem = checks.state.check(p.phi, self.phi, own_update);
        if (!problem && !self.sent.empty())
            problem = echoed_message(p.values, self.sent, own_update);
        if (!problem && !fused && p.weight >= self.weight)
            problem = idle_update(p.values, self.sent.empty() ? self.values : self.sent);
        // A fused partner's update where its update sample says it: judged as a split D is.
        std::optional<SampledUpdates> sample;
        if (!problem && fused && !p.sample_theta.empty()) {
            problem = unreadable_sample(p, checks.sample_at);
            if (!problem) sample = sampled_updates(p, self, phi, checks.sample_at);
        }
        auto on_sample = [&](std::optional<std::string> why) {
            if (why)
                why = "at its update sample's " + std::to_string(sample->own.size()) +
                      " coordinates, " + *why;
            return why;
        };
        if (!problem && sample && p.weight >= self.weight)
            problem = on_sample(idle_update(sample->partner, sample->own));
        // Direction tells only between members that trained alike: in token-budget rounds a
        // partner that trained three times this node's steps points away from its update as
        // often as a flipped one does (docs/security.md). The loss tells wherever the partner
        // trained at least this node's tokens, for more training scores no worse honestly,
        // while one that trained fewer scores worse and is not scored: a member can escape the
        // check only by claiming fewer tokens, which lowers its weight in the mean. A split D
        // is the partner's update itself, so its alignment is judged beside the loss, which
        // noise of a matched norm passes (not a sparse TOPK D's, whose alignment fades late in
        // training: checks.judge_alignment), and so is a fused partner's theta - phi at the
        // coordinates where its update sample says it. Without the sample a fused theta - phi also
        // holds the partner's drift from this node's phi, so its direction stands in only where
        // there is no held-out batch: honest pico daemons at H 8 score down to -0.52 beside a
        // decaying member. Late in training honest updates stop sharing a direction, and the
        // alignment test then stands aside (AlignmentPower).
        std::optional<Alignment> alignment;
        if (!problem && p.weight == self.weight) {
            if (!fused && checks.judge_alignment)
                alignment = alignment_score(p.values, self.values);
            else if (sample)
                alignment = alignment_score(sample->partner, sample->own);
            else if (!checks.held_out_loss)
                problem = opposed_update(p.values, self.values, fused ? phi : std::span<float>());
            if (alignment && checks.alignment_power.judging()) {
                problem = unaligned_score(alignment->score);
                if (sample) problem = on_sample(problem);
            }
        }
        if (!problem && p.weight >= self.weight && checks.held_out_loss) {
            if (!own_loss) {
                MemberValues as_sent = self;
                if (!fused && !self.sent.empty()) as_sent.values = self.sent;
                own_loss = checks.held_out_loss(theta_of(as_sent, fused, self.phi, scratch_a));
                if (!std::isfinite(*own_loss)) {
                    char text[96];
                    std::snprintf(text, sizeof text,
                                  "this node's own weights score %g on the held-out batch",
                                  *own_loss);
                    own_fault = text;
                    leave_out_unjudged(p);
                    continue;
                }
            }
            const double loss = checks.held_out_loss(theta_of(p, fused, self.phi, scratch_a));
            result.held_out_ratios[k] = loss / *own_loss;
            if (!(loss <= kMaxHeldOutLossRatio * *own_loss))
                problem = worse_on_held_out(loss, *own_loss);
        }
        if (problem) {
            result.refused.push_back({p.node_id, partner_name(p.node_id) + ": " + *problem});
            continue;
        }
        members.push_back(&p);
        if (alignment) checks.alignment_power.taken(*alignment);
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
    std::vector<double> weights, phi_weights;
    for (const MemberValues* m : members) {
        values.push_back(m->values);
        weights.push_back(checks.judge ? std::min(m->weight, kMaxTokenRatio * self.weight)
                                       : m->weight);
        if (!m->phi.empty()) {
            phis.push_back(m->phi);
            phi_weights.push_back(weights.back());
        }
    }
    group_mean(scratch_a, values, weights);
    if (fused) {
        outer_step_towards(config, phi, momentum, scratch_a);
    } else if (phis.size() < 2) {
        outer_step(config, phi, momentum, scratch_a, {});  // no partner sent phi: no pull
    } else {
        group_mean(scratch_b, phis, phi_weights);
        outer_step(config, phi, momentum, scratch_a, scratch_b);
    }
    return result;
}

DiLoCoStep diloco_outer_step(const OuterConfig& config,
                             std::span<const std::span<const float>> decoded, std::span<float> phi,
                             std::span<float> momentum, std::span<float> scratch,
                             std::span<const double> weights, bool judge) {
    if (!weights.empty() && weights.size() != decoded.size())
        throw Error("DiLoCo step: " + std::to_string(weights.size()) + " weights for " +
                    std::to_string(decoded.size()) + " members");
    for (const double w : weights)
        if (!(w > 0.0) || !std::isfinite(w)) throw Error("DiLoCo step: a weight is not positive");
    DiLoCoStep result;
    result.cosines.assign(decoded.size(), std::numeric_limits<double>::quiet_NaN());
    if (!judge) {
        result.members = static_cast<int>(decoded.size());
        group_mean(scratch, decoded, weights);
        outer_step(config, phi, momentum, scratch, {});
        return result;
    }
    std::vector<size_t> kept;
    std::vector<double> norms(decoded.size());
    for (size_t k = 0; k < decoded.size(); k++) {
        // Float values give a finite sum of squares in double: the norm is finite exactly when
        // every value is.
        norms[k] = euclidean_distance(decoded[k], {});
        (std::isfinite(norms[k]) ? kept : result.not_finite).push_back(k);
    }
    if (kept.empty()) return result;

    std::vector<double> kept_weights, kept_norms;
    for (const size_t k : kept) {
        kept_weights.push_back(weights.empty() ? 1.0 : weights[k]);
        kept_norms.push_back(norms[k]);
    }
    const double median_norm = lower_median(kept_norms);
    // A claim of tokens must be backed by the D's size: the steps of a member that trained r times
    // the median tokens add at worst like a random walk's, so its D is at least sqrt(r) times the
    // median norm. A claim beyond that, or beyond kMaxTokenRatio, counts as the most it could be.
    const double claimed_median = lower_median(kept_weights);
    for (size_t m = 0; m < kept.size(); m++) {
        const double ratio = median_norm > 0.0 ? kept_norms[m] / median_norm : 1.0;
        const double backed = std::max(1.0, ratio * ratio);
        kept_weights[m] =
            std::min(kept_weights[m], claimed_median * std::min(kMaxTokenRatio, backed));
    }
    // A member that trained more tokens than the median one may send a D of a proportionally
    // larger norm (an honest one sends less: its steps partly cancel); the rest are held to the
    // median norm. With equal weights every D is held to the median norm.
    const double median_weight = lower_median(kept_weights);
    std::vector<double> scales;  // 1, or what scales the D down to the norm allowed
    std::vector<float> shares;   // of each kept D in a sum, its clip included
    std::vector<bool> far;       // far above the norm allowed: left out where a majority can tell
    for (size_t m = 0; m < kept.size(); m++) {
        const double allowed = median_norm * std::max(1.0, kept_weights[m] / median_weight);
        const bool clip = kept_norms[m] > allowed;
        far.push_back(kept_norms[m] > kFarAboveAllowed * allowed);
        scales.push_back(clip ? allowed / kept_norms[m] : 1.0);
        shares.push_back(static_cast<float>(kept_weights[m] * scales.back()));
        if (clip) result.clipped.push_back(kept[m]);
    }
    // A D pointing away from where the others' go together is left out: a sign flip, noise, a
    // diverged or decayed replica. Three or more members make a majority to tell; every member
    // judges the same D's alike, so each still takes the same step.
    std::vector<std::span<const float>> members;
    for (const size_t k : kept) members.push_back(decoded[k]);
    result.staleness.assign(decoded.size(), std::numeric_limits<double>::quiet_NaN());
    const auto leave_out = [&](size_t m, std::vector<size_t>& list) {
        list.insert(list.begin(), kept[m]);
        const auto at = static_cast<std::ptrdiff_t>(m);
        for (auto* v : {&kept_weights, &kept_norms, &scales}) v->erase(v->begin() + at);
        members.erase(members.begin() + at);
        shares.erase(shares.begin() + at);
        kept.erase(kept.begin() + at);
    };
    if (kept.size() >= 3) {
        // The last outer step, as every member holds it (a joiner copies it with phi).
        const double norm = euclidean_distance(momentum, {});
        const double momentum_norm = std::isfinite(norm) ? norm : 0.0;
        Alignments aligned =
            alignments(members, shares, kept_norms, momentum, momentum_norm, scratch);
        for (size_t m = 0; m < kept.size(); m++) result.cosines[kept[m]] = aligned.with_others[m];
        result.median_cosine = lower_median(aligned.with_others);
        const size_t before = kept.size();
        for (size_t m = kept.size(); m-- > 0;) {
            const bool off_course =
                result.median_cosine > 0.0 &&
                aligned.with_others[m] < kMinCosineOfMedian * result.median_cosine;
            if (far[m] || off_course) leave_out(m, far[m] ? result.too_large : result.off_course);
        }
        // Staleness is judged among the D's still in, against their own sum: a D left out above
        // would otherwise set the median (of 4 members, one trained on random bytes, it made the
        // lowest honest staleness the median, and honest D's 0.25 to 0.3 above it were left out).
        std::vector<double> staleness, judged;
        if (kept.size() >= 3) {
            if (kept.size() != before)
                aligned = alignments(members, shares, kept_norms, momentum, momentum_norm, scratch);
            for (size_t m = 0; m < kept.size(); m++) {
                staleness.push_back(aligned.with_momentum[m] - aligned.with_others[m]);
                if (!std::isnan(staleness.back())) judged.push_back(staleness.back());
                result.staleness[kept[m]] = staleness.back();
            }
        }
        if (judged.size() >= 3) {
            result.median_staleness = lower_median(judged);
            // NaN compares false: a D not judged is never stale.
            for (size_t m = kept.size(); m-- > 0;)
                if (staleness[m] > result.median_staleness + kStaleMargin)
                    leave_out(m, result.stale);
        }
    }
    result.members = static_cast<int>(members.size());
    if (std::all_of(scales.begin(), scales.end(), [](double x) { return x == 1.0; })) {
        group_mean(scratch, members, weights.empty() ? std::span<const double>() : kept_weights);
    } else {
        double total = 0.0;
        for (const double w : kept_weights) total += w;
        shares.clear();
        for (size_t m = 0; m < members.size(); m++)
            shares.push_back(static_cast<float>(kept_weights[m] * scales[m] / total));
        weighted_sum(scratch, members, shares);
    }
    outer_step(config, phi, momentum, scratch, {});
    return result;
}

}  // namespace starling
