#include "model/manifest.h"

#include <cstdio>
#include <string_view>

#include "common/error.h"

namespace starling {

// Order matters and is relied upon by the model: q, k, v are adjacent so they form one (3C, C)
// matrix and one matmul; gate and up likewise form one (2F, C) matrix.
ParameterManifest::ParameterManifest(const ModelConfig& config) {
    config.validate();
    const int64_t C = config.d_model, F = config.d_ff, V = config.vocab_size;
    add("model.embed_tokens.weight", {V, C}, true);
    for (int l = 0; l < config.n_layer; l++) {
        const std::string p = "model.layers." + std::to_string(l) + ".";
        add(p + "input_layernorm.weight", {C}, false);
        add(p + "self_attn.q_proj.weight", {C, C}, true);
        add(p + "self_attn.k_proj.weight", {C, C}, true);
        add(p + "self_attn.v_proj.weight", {C, C}, true);
        add(p + "self_attn.o_proj.weight", {C, C}, true);
        add(p + "post_attention_layernorm.weight", {C}, false);
        add(p + "mlp.gate_proj.weight", {F, C}, true);
        add(p + "mlp.up_proj.weight", {F, C}, true);
        add(p + "mlp.down_proj.weight", {C, F}, true);
    }
    add("model.norm.weight", {C}, false);
    if (!config.tied_embeddings) add("lm_head.weight", {V, C}, true);

    char extra[96];
    std::snprintf(extra, sizeof extra, "rope_theta=%.9g;norm_eps=%.9g;heads=%d", config.rope_theta,
                  config.norm_eps, config.n_head);
    canonical_extra_ = extra;
}

void ParameterManifest::add(const std::string& name, std::vector<int64_t> shape, bool decay) {
    TensorInfo t;
    t.name = name;
    t.numel = 1;
    for (int64_t d : shape) t.numel *= static_cast<size_t>(d);
    t.shape = std::move(shape);
    t.offset = total_;
    t.decay = decay;
    total_ += t.numel;
    tensors_.push_back(std::move(t));
}

const TensorInfo& ParameterManifest::find(const std::string& name) const {
    for (const TensorInfo& t : tensors_) {
        if (t.name == name) return t;
    }
    throw Error("parameter manifest: no tensor named " + name);
}

std::vector<DecaySegment> ParameterManifest::decay_segments() const {
    std::vector<DecaySegment> segments;
    for (const TensorInfo& t : tensors_) {
        if (!segments.empty() && segments.back().decay == t.decay) {
            segments.back().numel += t.numel;
        } else {
            segments.push_back({t.offset, t.numel, t.decay});
        }
    }
    return segments;
}

std::string ParameterManifest::fingerprint() const {
    uint64_t h = 0xcbf29ce484222325ULL;
    auto feed = [&h](std::string_view s) {
        for (unsigned char c : s) {
            h ^= c;
            h *= 0x100000001b3ULL;
        }
    };
    for (const TensorInfo& t : tensors_) {
        feed(t.name);
        feed("|f32|");
        for (int64_t d : t.shape) {
            feed(std::to_string(d));
            feed(",");
        }
        feed("|");
        feed(std::to_string(t.offset));
        feed("\n");
    }
    feed(canonical_extra_);
    char hex[17];
    std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(h));
    return hex;
}

}  // namespace starling
