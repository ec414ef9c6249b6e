#include "optimizer/sanity.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "common/error.h"

namespace starling {

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
    for (size_t i = 0; i < decoded.size(); i++) {
        if (!std::isfinite(decoded[i])) return "value " + std::to_string(i) + " is not finite";
    }
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

double euclidean_distance(std::span<const float> a, std::span<const float> b) {
    double sum_squares = 0.0;
    for (size_t i = 0; i < a.size(); i++) {
        const double d = static_cast<double>(a[i]) - (b.empty() ? 0.0f : b[i]);
        sum_squares += d * d;
    }
    return std::sqrt(sum_squares);
}

}  // namespace starling
