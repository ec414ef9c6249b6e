// Model hyperparameters: everything that fixes the parameter layout and the forward pass.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace starling {

struct ModelConfig {
    int n_layer = 2;
    int n_head = 4;
    int d_model = 64;      // C
    int d_ff = 192;        // F, SwiGLU hidden size
    int vocab_size = 256;  // V
    int context = 64;      // longest sequence the model is trained on (T)
    bool tied_embeddings = true;
    float rope_theta = 10000.0f;
    float norm_eps = 1e-5f;
    float init_std = 0.02f;

    int head_size() const { return d_model / n_head; }
    // Throws starling::Error naming the offending field.
    void validate() const;
    // Parameters and training FLOPs per token (6N for the matmuls plus attention's 6*L*C*T).
    int64_t num_parameters() const;
    double flops_per_token(int seq_len) const;
};

// The keys that make two models different, as "key=value" words ("n_layer=2 n_head=4 ..."): what
// a node tells its peers, so that one with another model hears which key differs.
std::string model_signature(const ModelConfig& config);
// The keys on which two signatures differ: "n_layer 4 there, 2 here; d_model 128 there, 64 here";
// "" when they agree. A key one side lacks shows as "none".
std::string signature_differences(std::string_view theirs, std::string_view ours);

}  // namespace starling
