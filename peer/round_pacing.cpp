#include "peer/round_pacing.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>

namespace starling {

double automatic_round_seconds(std::vector<double> step_seconds, int inner_steps,
                               double uneven_margin, bool budget_now) {
    if (step_seconds.size() < 2) return 0.0;
    const auto [fastest, slowest] = std::minmax_element(step_seconds.begin(), step_seconds.end());
    const double margin = budget_now ? uneven_margin / 2.0 : uneven_margin;
    if (*slowest <= (1.0 + margin) * *fastest) return 0.0;
    // Selected, not sorted: each phase of every node reads the step times of the whole swarm.
    const size_t n = step_seconds.size();
    const auto upper = step_seconds.begin() + static_cast<std::ptrdiff_t>(n / 2);
    std::nth_element(step_seconds.begin(), upper, step_seconds.end());
    const double median =
        n % 2 == 1 ? *upper : (*std::max_element(step_seconds.begin(), upper) + *upper) / 2.0;
    return inner_steps * median;
}

int phase_steps_in(double budget, double step_seconds, int inner_steps) {
    if (budget <= 0.0 || step_seconds <= 0.0) return inner_steps;
    const double fits = std::round(budget / step_seconds);
    return static_cast<int>(std::clamp(fits, 1.0, 16.0 * inner_steps));
}

SteadyClock::time_point heard_lately_since(std::span<const PairingFacts> others,
                                           SteadyClock::time_point since) {
    constexpr auto all = SteadyClock::time_point::min();
    if (others.size() <= kMinHeardLately) return all;
    std::vector<SteadyClock::time_point> heard;
    heard.reserve(others.size());
    for (const PairingFacts& m : others) heard.push_back(m.heard);
    const auto kth = heard.begin() + kMinHeardLately - 1;
    std::nth_element(heard.begin(), kth, heard.end(), std::greater<>());
    if (*kth >= since) return since;
    return *kth == SteadyClock::time_point{} ? all : *kth;
}

std::vector<PairingFacts> heard_lately(std::span<const PairingFacts> others,
                                       SteadyClock::time_point now, double window_s) {
    const auto window = std::chrono::duration_cast<SteadyClock::duration>(
        std::chrono::duration<double>(std::max(window_s, 2.0)));
    const auto since = heard_lately_since(others, now - window);
    std::vector<PairingFacts> heard;
    for (const PairingFacts& m : others)
        if (m.heard >= since) heard.push_back(m);
    return heard;
}

std::optional<uint64_t> median_round(std::span<const PairingFacts> others) {
    std::vector<uint64_t> rounds;
    rounds.reserve(others.size());
    for (const PairingFacts& m : others) rounds.push_back(m.round);
    if (rounds.empty()) return std::nullopt;
    std::nth_element(rounds.begin(), rounds.begin() + rounds.size() / 2, rounds.end());
    return rounds[rounds.size() / 2];
}

uint64_t training_round(const PairingFacts& m) {
    return m.round + (std::max(m.paired_through, m.solo_through) > m.round ? 1 : 0);
}

std::optional<uint64_t> median_training_round(std::span<const PairingFacts> others) {
    std::vector<PairingFacts> trained(others.begin(), others.end());
    for (PairingFacts& m : trained) m.round = training_round(m);
    return median_round(trained);
}

CatchUp catch_up(std::optional<uint64_t> median, uint64_t position, uint64_t max_round_gap,
                 std::optional<uint64_t> copy_cost_rounds, bool pairs) {
    if (!median || *median <= position) return CatchUp::None;
    const uint64_t behind = *median - position;
    if (behind <= max_round_gap) return pairs ? CatchUp::Skip : CatchUp::None;
    return copy_cost_rounds && behind <= *copy_cost_rounds ? CatchUp::Skip : CatchUp::Copy;
}

std::optional<uint64_t> round_after_copy(std::optional<uint64_t> median, uint64_t copied,
                                         uint64_t max_round_gap, bool pairs) {
    if (!median) return std::nullopt;
    if (pairs) return *median + 1 > copied ? std::optional<uint64_t>(*median + 1) : std::nullopt;
    if (catch_up(median, copied, max_round_gap, std::nullopt, false) == CatchUp::None)
        return std::nullopt;
    return median;
}

bool ahead_of_all(std::span<const PairingFacts> others, uint64_t round, uint64_t max_round_gap) {
    return !others.empty() && std::all_of(others.begin(), others.end(), [&](const PairingFacts& m) {
        return m.round + max_round_gap < round;
    });
}

double slower_refresh_seconds(double phase_seconds) {
    return std::clamp(phase_seconds / 100.0, 0.01, 0.25);
}

SlowerWait::SlowerWait(const std::vector<uint64_t>& slower)
    : queue_(slower.begin(), slower.end()) {}

std::vector<uint64_t> SlowerWait::next(const StillSlower& still_slower) {
    std::vector<uint64_t> batch;
    while (batch.size() < kRefreshFanout && !queue_.empty()) {
        const uint64_t id = queue_.front();
        queue_.pop_front();
        if (still_slower(id)) batch.push_back(id);
    }
    queue_.insert(queue_.end(), batch.begin(), batch.end());
    return batch;
}

bool SlowerWait::over(const StillSlower& still_slower) {
    while (!queue_.empty() && !still_slower(queue_.front())) queue_.pop_front();
    return queue_.empty();
}

bool is_slower_in_reach(uint64_t round, uint64_t training, uint64_t max_round_gap) {
    return round + 1 < training && round + 1 + max_round_gap >= training;
}

std::vector<uint64_t> slower_in_reach(std::span<const PairingFacts> others, uint64_t training,
                                      uint64_t max_round_gap) {
    std::vector<uint64_t> slower;
    for (const PairingFacts& m : others)
        if (is_slower_in_reach(m.round, training, max_round_gap)) slower.push_back(m.node_id);
    return slower;
}

}  // namespace starling
