#include "optimizer/schedule.h"

#include <cmath>
#include <numbers>
#include <string>

#include "common/error.h"

namespace starling {

float LrSchedule::lr_at(int64_t step) const {
    if (step < warmup_steps) {
        return max_lr * static_cast<float>(step + 1) / static_cast<float>(warmup_steps);
    }
    const double min_lr = static_cast<double>(max_lr) * min_lr_fraction;
    if (step >= total_steps) return static_cast<float>(min_lr);
    const double progress =
        static_cast<double>(step - warmup_steps) / static_cast<double>(total_steps - warmup_steps);
    const double cosine = 0.5 * (1.0 + std::cos(std::numbers::pi * progress));
    return static_cast<float>(min_lr + (max_lr - min_lr) * cosine);
}

void LrSchedule::validate() const {
    if (!(max_lr > 0.0f)) throw Error("optimizer: lr must be positive");
    if (warmup_steps < 0) throw Error("optimizer: warmup_steps must not be negative");
    if (total_steps <= warmup_steps) {
        throw Error("optimizer: the run's steps (" + std::to_string(total_steps) +
                    ") must exceed warmup_steps (" + std::to_string(warmup_steps) + ")");
    }
    if (min_lr_fraction < 0.0f || min_lr_fraction > 1.0f) {
        throw Error("optimizer: min_lr_fraction must be in [0, 1]");
    }
}

}  // namespace starling
