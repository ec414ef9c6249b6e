#include <algorithm>
#include <cmath>
#include <cstdio>

#include "sim/swarm_sim.h"

namespace starling::sim {
namespace {

std::string line(const char* name, const Spread& s) {
    char text[160];
    std::snprintf(text, sizeof(text), "%-34s %6zu  median %7.2f s  p90 %7.2f s  max %7.2f s\n",
                  name, s.count, s.median, s.p90, s.max);
    return text;
}

std::string format_round_figures(const Figures& f) {
    char text[1024];
    const double share =
        f.choices ? static_cast<double>(f.paired_choices) / static_cast<double>(f.choices) : 0;
    std::snprintf(
        text, sizeof(text),
        "rounds: median round at the end %llu, choices %llu, paired %.4f of them, "
        "exchange timeouts %llu\n"
        "pacing: skips to the median round %llu, state copies %llu, waits while ahead "
        "%llu, waits for a slower member %llu\n"
        "%-34s %6zu  median %7.2f s  p90 %7.2f s  max %7.2f s\n"
        "%-34s %6zu  median %7.0f    p90 %7.0f    max %7.0f   (%zu joiners unpaired, after at most %d choices)\n"
        "phi's spread (standard deviation over the nodes) after r rounds:",
        static_cast<unsigned long long>(f.rounds_median),
        static_cast<unsigned long long>(f.choices), share,
        static_cast<unsigned long long>(f.exchange_timeouts),
        static_cast<unsigned long long>(f.skips), static_cast<unsigned long long>(f.state_copies),
        static_cast<unsigned long long>(f.ahead_waits),
        static_cast<unsigned long long>(f.slower_waits), "round length", f.round_seconds.count,
        f.round_seconds.median, f.round_seconds.p90, f.round_seconds.max,
        "joiner's rounds to its first pair", f.first_pair_rounds.count, f.first_pair_rounds.median,
        f.first_pair_rounds.p90, f.first_pair_rounds.max, f.joiners_unpaired,
        f.unpaired_joiner_choices_max);
    std::string out = line("choosing a partner", f.choice_seconds) +
                      line("waiting before a phase", f.wait_seconds);
    if (f.private_choices) {
        char private_text[160];
        std::snprintf(
            private_text, sizeof(private_text),
            "private nodes: choices %llu, paired %.4f of them; proposals lost to them %llu\n",
            static_cast<unsigned long long>(f.private_choices),
            static_cast<double>(f.private_paired_choices) / static_cast<double>(f.private_choices),
            static_cast<unsigned long long>(f.pair_calls_lost));
        out += private_text;
    }
    out += text;
    for (const auto& [round, spread] : f.phi_spread) {
        std::snprintf(text, sizeof(text), " r=%llu %.3g", static_cast<unsigned long long>(round),
                      spread);
        out += text;
    }
    return out + "\n";
}

}  // namespace

Spread spread_of(std::vector<double> values) {
    Spread s;
    s.count = values.size();
    if (values.empty()) return s;
    std::sort(values.begin(), values.end());
    // Nearest rank.
    const auto at = [&](double q) {
        const double rank = std::ceil(q * static_cast<double>(values.size()));
        return values[static_cast<size_t>(std::max(1.0, rank)) - 1];
    };
    s.median = at(0.5);
    s.p90 = at(0.9);
    s.max = values.back();
    return s;
}

std::string format_figures(const SimConfig& config, const Figures& f) {
    char text[2048];
    const double per_day = f.node_hours > 0 ? 24.0 / f.node_hours : 0;
    std::snprintf(
        text, sizeof(text),
        "simulated %.0f s of %d nodes (seed %llu): %d up at the end, %.1f node-hours counted\n"
        "events %llu, trace hash %016llx, wall time %.2f s\n"
        "false suspicions (up members)      %6llu  %.3f per node-day\n"
        "suspicions of slow members         %6llu  %.3f per node-day\n"
        "suspicions of frozen members       %6llu\n"
        "up / frozen members declared dead %6llu / %llu (declarations, one per node)\n"
        "membership payload                 %.0f bytes per node per s, %.2f calls per node per s, "
        "largest message %.0f bytes\n"
        "up members listed alive by up nodes at the end: %.4f\n"
        "joins unknown to some at the end %zu, crashes still listed alive by some %zu\n"
        "partition healed (every up node lists every up member alive) %.0f s after it ended "
        "(-1: not, or none)\n",
        config.seconds, config.nodes, static_cast<unsigned long long>(config.seed), f.nodes_end,
        f.node_hours, static_cast<unsigned long long>(f.events),
        static_cast<unsigned long long>(f.trace_hash), f.wall_s,
        static_cast<unsigned long long>(f.false_suspicions),
        static_cast<double>(f.false_suspicions) * per_day,
        static_cast<unsigned long long>(f.slow_suspicions),
        static_cast<double>(f.slow_suspicions) * per_day,
        static_cast<unsigned long long>(f.frozen_suspicions),
        static_cast<unsigned long long>(f.false_deaths),
        static_cast<unsigned long long>(f.frozen_deaths), f.payload_bytes_per_node_s,
        f.calls_per_node_s, f.largest_message_bytes, f.alive_view_share, f.joins_unfinished,
        f.crashes_unfinished, f.partition_healed_s);
    std::string out = text + line("join known by all", f.join_known_by_all) +
                      line("crash first suspected", f.crash_first_suspected) +
                      line("crash known by all", f.crash_known_by_all);
    if (config.rounds.enabled) out += format_round_figures(f);
    return out;
}

}  // namespace starling::sim
