#include "optimizer/sanity.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

#include "common/error.h"

namespace starling {
namespace {

// Six significant digits: a norm of 3e+11 reads as one.
std::string short_number(double value) {
    char text[32];
    std::snprintf(text, sizeof text, "%.6g", value);
    return text;
}

}  // namespace

MessageSanity::MessageSanity(double factor, size_t window) : factor_(factor), window_(window) {
    if (!(factor > 1.0) || window < 3) {
        throw Error("message sanity: the factor must exceed 1 and the window hold 3 or more");
    }
}

std::optional<std::string> MessageSanity::check(std::span<const float> decoded,
                                                std::span<const float> own, double own_update) {
    if (decoded.size() != own.size()) {
        return "it holds " + std::to_string(decoded.size()) + " values, this node " +
               std::to_string(own.size());
    }
    if (const auto i = first_non_finite(decoded))
        return "value " + std::to_string(*i) + " is not finite";
    const double distance = euclidean_distance(decoded, own);
    if (!std::isfinite(distance) || !std::isfinite(own_update)) {
        // Finite decoded values but a NaN or Inf distance or update: this node's own values are
        // broken, and a non-finite number must not enter the history the median is taken from.
        return "the distance from this node's values is not finite (this node's values are)";
    }
    double median = 0.0;
    if (!accepted_.empty()) {
        std::vector<double> sorted(accepted_.begin(), accepted_.end());
        std::nth_element(sorted.begin(), sorted.begin() + sorted.size() / 2, sorted.end());
        median = sorted[sorted.size() / 2];
    }
    const double reference = std::max(own_update, median);
    if (reference > 0.0 && distance > factor_ * reference) {
        return "its distance from this node's values, " + std::to_string(distance) + ", exceeds " +
               std::to_string(factor_) + " times the larger of this node's own update " +
               std::to_string(own_update) + " and the median accepted distance " +
               std::to_string(median);
    }
    accepted_.push_back(distance);
    if (accepted_.size() > window_) accepted_.pop_front();
    return std::nullopt;
}

std::optional<std::string> opposed_update(std::span<const float> partner,
                                          std::span<const float> own, std::span<const float> base) {
    double dot = 0.0, partner_squared = 0.0, own_squared = 0.0;
    for (size_t i = 0; i < own.size(); i++) {
        const double b = base.empty() ? 0.0 : base[i];
        const double u = partner[i] - b, v = own[i] - b;
        dot += u * v;
        partner_squared += u * u;
        own_squared += v * v;
    }
    const double norms = std::sqrt(partner_squared) * std::sqrt(own_squared);
    if (!(norms > 0.0) || dot >= kMinUpdateCosine * norms) return std::nullopt;
    return "its update points away from this node's (cosine " + short_number(dot / norms) + ")";
}

std::optional<Alignment> alignment_score(std::span<const float> partner,
                                         std::span<const float> own) {
    double sum = 0.0, spread_squared = 0.0;
    size_t terms = 0;
    for (size_t i = 0; i < own.size(); i++) {
        const double term = static_cast<double>(partner[i]) * own[i];
        sum += term;
        spread_squared += term * term;
        terms += term != 0.0;
    }
    if (terms < kMinAlignmentTerms) return std::nullopt;
    return Alignment{sum / std::sqrt(spread_squared), terms};
}

std::optional<std::string> unaligned_score(double score) {
    if (score >= kMinUpdateAlignment) return std::nullopt;
    return "its D is no more aligned with this node's than random signs would be (" +
           short_number(score) + " standard deviations, under " +
           short_number(kMinUpdateAlignment) + ")";
}

std::optional<std::string> unaligned_update(std::span<const float> partner,
                                            std::span<const float> own) {
    const auto alignment = alignment_score(partner, own);
    return alignment ? unaligned_score(alignment->score) : std::nullopt;
}

bool AlignmentPower::judging() const {
    if (per_root_term_.size() < kAlignmentPowerMinScores) return true;
    // The lower median: at least half the partners must reach the bar.
    std::vector<double> sorted(per_root_term_.begin(), per_root_term_.end());
    const auto middle = sorted.begin() + static_cast<std::ptrdiff_t>((sorted.size() - 1) / 2);
    std::nth_element(sorted.begin(), middle, sorted.end());
    return *middle >= kMinAlignmentPower;
}

void AlignmentPower::taken(const Alignment& alignment) {
    per_root_term_.push_back(alignment.score / std::sqrt(static_cast<double>(alignment.terms)));
    if (per_root_term_.size() > kAlignmentPowerWindow) per_root_term_.pop_front();
}

std::optional<std::string> idle_update(std::span<const float> partner, std::span<const float> own) {
    const double partner_norm = euclidean_distance(partner, {});
    const double own_norm = euclidean_distance(own, {});
    if (!(partner_norm < kMinUpdateRatio * own_norm)) return std::nullopt;
    return "its D has a norm of " + short_number(partner_norm) + ", under " +
           short_number(kMinUpdateRatio) + " times this node's own " + short_number(own_norm) +
           ": it barely trained";
}

std::optional<std::string> echoed_message(std::span<const float> partner,
                                          std::span<const float> sent, double own_update) {
    const double distance = euclidean_distance(partner, sent);
    if (!(distance < kMinEchoDistance * own_update)) return std::nullopt;
    return "its values are this node's own message sent back (distance " + short_number(distance) +
           " from it, this node's update " + short_number(own_update) + ")";
}

std::optional<size_t> first_non_finite(std::span<const float> values) {
    for (size_t i = 0; i < values.size(); i++) {
        if (!std::isfinite(values[i])) return i;
    }
    return std::nullopt;
}

double euclidean_distance(std::span<const float> a, std::span<const float> b) {
    double sum_squares = 0.0;
    for (size_t i = 0; i < a.size(); i++) {
        const double d = static_cast<double>(a[i]) - (b.empty() ? 0.0f : b[i]);
        sum_squares += d * d;
    }
    return std::sqrt(sum_squares);
}

std::optional<std::string> far_from_median(double norm, std::span<const double> votes,
                                           double factor) {
    if (!(factor > 1.0)) throw Error("far_from_median: the factor must exceed 1");
    if (!std::isfinite(norm)) return "norm " + short_number(norm) + " is not finite";
    std::vector<double> counted;
    for (const double vote : votes) {
        if (std::isfinite(vote) && vote > 0.0) counted.push_back(vote);
    }
    if (counted.empty()) return std::nullopt;
    std::sort(counted.begin(), counted.end());
    const size_t middle = counted.size() / 2;
    const double median = counted.size() % 2 == 1 ? counted[middle]
                                                  : std::sqrt(counted[middle - 1]) *
                                                        std::sqrt(counted[middle]);  // no overflow
    if (norm > factor * median || norm * factor < median) {
        return "norm " + short_number(norm) + " is not within a factor of " + short_number(factor) +
               " of the median " + short_number(median) + " of " + std::to_string(counted.size()) +
               " norms";
    }
    return std::nullopt;
}

}  // namespace starling
