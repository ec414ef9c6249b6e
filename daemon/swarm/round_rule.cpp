#include "daemon/swarm/round_rule.h"

#include <algorithm>

namespace starling {

double automatic_round_seconds(std::vector<double> step_seconds, int inner_steps,
                               double uneven_margin, bool budget_now) {
    if (step_seconds.size() < 2) return 0.0;
    std::sort(step_seconds.begin(), step_seconds.end());
    const double margin = budget_now ? uneven_margin / 2.0 : uneven_margin;
    if (step_seconds.back() <= (1.0 + margin) * step_seconds.front()) return 0.0;
    const size_t n = step_seconds.size();
    const double median =
        n % 2 == 1 ? step_seconds[n / 2] : (step_seconds[n / 2 - 1] + step_seconds[n / 2]) / 2.0;
    return inner_steps * median;
}

}  // namespace starling
