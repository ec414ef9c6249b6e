#include "model/generate.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <string>

#include "common/error.h"

namespace starling {

int draw_token(std::span<const float> logits, float temperature, int top_k, double u) {
    const int V = static_cast<int>(logits.size());
    if (temperature <= 0.0f)
        return static_cast<int>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    std::vector<int> order(V);
    std::iota(order.begin(), order.end(), 0);
    // Stable, so equal logits keep their id order and a draw is the same on every machine.
    std::stable_sort(order.begin(), order.end(),
                     [&](int a, int b) { return logits[a] > logits[b]; });
    const int kept = top_k > 0 ? std::min(top_k, V) : V;
    std::vector<double> weights(kept);
    const double top = logits[order[0]];
    for (int i = 0; i < kept; i++) weights[i] = std::exp((logits[order[i]] - top) / temperature);
    const double total = std::accumulate(weights.begin(), weights.end(), 0.0);
    double cumulative = 0.0;
    for (int i = 0; i < kept; i++) {
        cumulative += weights[i] / total;
        if (u < cumulative) return order[i];
    }
    return order[kept - 1];  // u within rounding of 1
}

std::vector<int32_t> continue_tokens(Model<float>& model, std::span<const int32_t> prompt,
                                     const SampleOptions& options) {
    if (prompt.empty()) throw Error("sample: the prompt is empty; give at least one token");
    if (model.batch_size() != 1) throw Error("sample: the model must be built for one sequence");
    if (options.tokens < 0) throw Error("sample: a negative number of tokens");
    if (!(options.temperature >= 0.0f) || !std::isfinite(options.temperature))
        throw Error("sample: the temperature must be 0 or more");
    if (options.top_k < 0) throw Error("sample: top_k must be 0 (all) or more");
    const int V = model.config().vocab_size;
    if (options.vocab < 0 || options.vocab > V)
        throw Error("sample: vocab " + std::to_string(options.vocab) +
                    " is outside [0, the model's " + std::to_string(V) + "]");
    const size_t drawn = size_t(options.vocab > 0 ? options.vocab : V);
    const int T = model.seq_len();
    std::vector<int32_t> text(prompt.begin(), prompt.end());
    std::vector<int32_t> window(T), targets(T, 0);
    std::mt19937_64 rng(options.seed);
    std::uniform_real_distribution<double> uniform(0.0, 1.0);
    for (int i = 0; i < options.tokens; i++) {
        const int length = std::min<int>(T, static_cast<int>(text.size()));
        std::fill(window.begin(), window.end(),
                  0);  // positions after the text do not reach it (causal)
        std::copy(text.end() - length, text.end(), window.begin());
        model.forward(window.data(), targets.data());
        const std::vector<float> logits = model.logits_at(0, length - 1);
        text.push_back(draw_token(std::span(logits).first(drawn), options.temperature,
                                  options.top_k, uniform(rng)));
    }
    return {text.begin() + static_cast<std::ptrdiff_t>(prompt.size()), text.end()};
}

}  // namespace starling
