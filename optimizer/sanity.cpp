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
                                                std::span<const float> own) {
    if (decoded.size() != own.size()) {
        return "it holds " + std::to_string(decoded.size()) + " values, this node " +
               std::to_string(own.size());
    }
    double sum_squares = 0.0;
    for (size_t i = 0; i < own.size(); i++) {
        if (!std::isfinite(decoded[i])) {
            return "value " + std::to_string(i) + " is not finite";
        }
        const double d = static_cast<double>(decoded[i]) - own[i];
        sum_squares += d * d;
    }
    const double distance = std::sqrt(sum_squares);
    if (!std::isfinite(distance)) {
        // Finite decoded values but a NaN or Inf distance: this node's own values are broken, and
        // a non-finite number must not enter the history the median is taken from.
        return "the distance from this node's values is not finite (this node's values are)";
    }
    std::optional<std::string> problem;
    if (recent_.size() == window_) {
        std::vector<double> sorted(recent_.begin(), recent_.end());
        std::nth_element(sorted.begin(), sorted.begin() + sorted.size() / 2, sorted.end());
        const double median = sorted[sorted.size() / 2];
        if (distance > factor_ * median) {
            problem = "its distance from this node's values, " + std::to_string(distance) +
                      ", exceeds " + std::to_string(factor_) + " times the recent median " +
                      std::to_string(median);
        }
    }
    recent_.push_back(distance);
    if (recent_.size() > window_) recent_.pop_front();
    return problem;
}

}  // namespace starling
