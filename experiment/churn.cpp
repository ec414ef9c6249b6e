#include "experiment/churn.h"

#include <algorithm>
#include <cmath>

#include "common/random.h"

namespace starling {

ChurnSchedule::ChurnSchedule(const ChurnConfig& config, int replicas, int inner_steps)
    : config_(config), inner_steps_(inner_steps) {
    down_rounds_ = (config.down_steps + inner_steps - 1) / inner_steps;
    for (int i = 0; i < replicas; i++) next_change_.push_back(draw_up_rounds());
}

uint64_t ChurnSchedule::next_random() { return hash_index(config_.seed, counter_++); }

int64_t ChurnSchedule::draw_up_rounds() {
    const double steps = -config_.mean_up_steps * std::log(uniform_open01(next_random()));
    return std::max<int64_t>(1, static_cast<int64_t>(std::ceil(steps / inner_steps_)));
}

ChurnSchedule::Changes ChurnSchedule::at_round(int64_t round, const std::vector<bool>& live) {
    Changes changes;
    int live_count = static_cast<int>(std::count(live.begin(), live.end(), true));
    for (size_t i = 0; i < next_change_.size(); i++) {
        if (round < next_change_[i]) continue;
        if (!live[i]) {
            changes.returning.push_back(static_cast<int>(i));
            next_change_[i] = round + draw_up_rounds();
        } else if (live_count > 1) {
            changes.leaving.push_back(static_cast<int>(i));
            live_count--;
            next_change_[i] = round + down_rounds_;
        } else {
            next_change_[i] = round + draw_up_rounds();
        }
    }
    return changes;
}

int ChurnSchedule::pick_sponsor(const std::vector<int>& candidates) {
    return candidates[next_random() % candidates.size()];
}

}  // namespace starling
