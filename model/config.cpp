#include "model/config.h"

#include <cstdio>
#include <map>
#include <string>

#include "common/error.h"
#include "model/manifest.h"

namespace starling {

namespace {

void require(bool ok, const std::string& problem) {
    if (!ok) throw Error("model config: " + problem);
}

}  // namespace

void ModelConfig::validate() const {
    require(n_layer >= 1, "n_layer must be at least 1, got " + std::to_string(n_layer));
    require(n_head >= 1, "n_head must be at least 1, got " + std::to_string(n_head));
    require(d_model >= 1, "d_model must be at least 1, got " + std::to_string(d_model));
    require(d_model % n_head == 0, "d_model " + std::to_string(d_model) +
                                       " is not divisible by n_head " + std::to_string(n_head));
    require(head_size() % 2 == 0,
            "head size d_model/n_head = " + std::to_string(head_size()) + " must be even for RoPE");
    require(d_ff >= 1, "d_ff must be at least 1, got " + std::to_string(d_ff));
    require(
        vocab_size >= 2 && vocab_size <= 65536,
        "vocab_size must be in [2, 65536] (tokens are uint16), got " + std::to_string(vocab_size));
    require(context >= 1, "context must be at least 1, got " + std::to_string(context));
    require(rope_theta > 0.0f, "rope_theta must be positive");
    require(norm_eps > 0.0f, "norm_eps must be positive");
    require(init_std > 0.0f, "init_std must be positive");
}

int64_t ModelConfig::num_parameters() const {
    return static_cast<int64_t>(ParameterManifest(*this).total());
}

double ModelConfig::flops_per_token(int seq_len) const {
    return 6.0 * static_cast<double>(num_parameters()) +
           6.0 * n_layer * static_cast<double>(d_model) * seq_len;
}

std::string model_signature(const ModelConfig& c) {
    char text[256];
    std::snprintf(
        text, sizeof text,
        "n_layer=%d n_head=%d d_model=%d d_ff=%d vocab_size=%d context=%d tied_embeddings=%s rope_theta=%.9g "
        "norm_eps=%.9g",
        c.n_layer, c.n_head, c.d_model, c.d_ff, c.vocab_size, c.context,
        c.tied_embeddings ? "true" : "false", c.rope_theta, c.norm_eps);
    return text;
}

namespace {

std::map<std::string, std::string> signature_words(std::string_view signature) {
    std::map<std::string, std::string> words;
    size_t start = 0;
    while (start < signature.size()) {
        size_t end = signature.find(' ', start);
        if (end == std::string_view::npos) end = signature.size();
        const std::string_view word = signature.substr(start, end - start);
        if (const size_t eq = word.find('='); eq != std::string_view::npos)
            words[std::string(word.substr(0, eq))] = std::string(word.substr(eq + 1));
        start = end + 1;
    }
    return words;
}

}  // namespace

std::string signature_differences(std::string_view theirs, std::string_view ours) {
    const auto there = signature_words(theirs), here = signature_words(ours);
    std::map<std::string, std::pair<std::string, std::string>> keys;
    for (const auto& [key, value] : there) keys[key] = {value, "none"};
    for (const auto& [key, value] : here) {
        auto [it, added] = keys.try_emplace(key, "none", value);
        if (!added) it->second.second = value;
    }
    std::string text;
    for (const auto& [key, values] : keys) {
        if (values.first == values.second) continue;
        text += (text.empty() ? "" : "; ") + key + " " + values.first + " there, " + values.second +
                " here";
    }
    return text;
}

}  // namespace starling
