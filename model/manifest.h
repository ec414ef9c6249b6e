// The parameter manifest: every tensor of the model as a named view (offset, shape) into one flat
// fp32 arena. The same order is used for gradients, AdamW moments, outer-optimizer state and
// checkpoints, and its hash is the model fingerprint that peers compare before exchanging.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "model/config.h"

namespace starling {

struct TensorInfo {
    std::string name;  // Hugging Face Llama name, e.g. model.layers.0.self_attn.q_proj.weight
    std::vector<int64_t> shape;  // (out, in) for matrices
    size_t offset = 0;           // in elements, into the flat arena
    size_t numel = 0;
    bool decay = false;  // weight decay applies (matrices, not norm gains)
};

// A run of consecutive tensors sharing one weight-decay setting, so AdamW makes a handful of
// calls over the arena instead of one per tensor.
struct DecaySegment {
    size_t offset = 0;
    size_t numel = 0;
    bool decay = false;
};

class ParameterManifest {
public:
    explicit ParameterManifest(const ModelConfig& config);

    const std::vector<TensorInfo>& tensors() const { return tensors_; }
    const TensorInfo& find(const std::string& name) const;  // throws starling::Error if absent
    size_t total() const { return total_; }
    std::vector<DecaySegment> decay_segments() const;
    // 16 hex digits of FNV-1a over the canonical manifest text plus the hyperparameters that
    // change the forward pass without changing shapes (rope_theta, norm_eps).
    std::string fingerprint() const;

private:
    void add(const std::string& name, std::vector<int64_t> shape, bool decay);

    std::vector<TensorInfo> tensors_;
    size_t total_ = 0;
    std::string canonical_extra_;
};

}  // namespace starling
