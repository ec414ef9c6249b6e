// The Llama-style decoder: token embedding, per layer pre-RMSNorm -> causal attention with RoPE
// -> residual, pre-RMSNorm -> SwiGLU MLP -> residual, then a final RMSNorm and the output head
// (tied to the embedding or not). No biases.
//
// Memory is four flat arenas allocated once from the backend: parameters, gradients (both in
// manifest order), activations and activation gradients. Real is float for training and double
// for the finite-difference tests, which run the very same code.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/ops.h"
#include "model/config.h"
#include "model/manifest.h"

namespace starling {

template <typename Real>
class Model {
public:
    // B sequences of T tokens per forward pass; T must not exceed config.context.
    Model(const ModelConfig& config, Ops<Real>& ops, int B, int T);
    ~Model();
    Model(const Model&) = delete;
    Model& operator=(const Model&) = delete;

    const ModelConfig& config() const { return config_; }
    const ParameterManifest& manifest() const { return manifest_; }
    Ops<Real>& ops() { return ops_; }
    int batch_size() const { return B_; }
    int seq_len() const { return T_; }
    size_t num_params() const { return manifest_.total(); }
    size_t activation_bytes() const;

    Real* params() { return params_; }
    const Real* params() const { return params_; }
    Real* grads() { return grads_; }

    // Seeded initialisation: matrices N(0, init_std), residual projections (o_proj, down_proj)
    // N(0, init_std / sqrt(2 * n_layer)), norm gains 1. A pure function of (seed, manifest).
    void init_weights(uint64_t seed);

    // inputs and targets are host arrays of B*T token ids. Returns the mean cross-entropy in nats.
    double forward(const int32_t* inputs, const int32_t* targets);
    // The per-position losses (B*T) of the last forward(), on the host.
    std::vector<double> position_losses();
    // The output logits (vocab_size) at position t of sequence b after the last forward(), on the
    // host; backward() overwrites them.
    std::vector<Real> logits_at(int b, int t);
    void zero_grad();
    // Adds d(mean loss)/d(params) into grads(); needs the preceding forward(). Overwrites logits.
    void backward();

private:
    struct LayerWeights {
        Real* ln1;    // (C)
        Real* wqkv;   // (3C, C): q_proj, k_proj, v_proj stacked
        Real* wo;     // (C, C)
        Real* ln2;    // (C)
        Real* wgu;    // (2F, C): gate_proj, up_proj stacked
        Real* wdown;  // (C, F)
    };
    struct LayerActs {
        Real* residual;  // (N, C) input of the layer
        Real* ln1;       // (N, C)
        Real* rstd1;     // (N)
        Real* qkv;       // (N, 3C) after RoPE
        Real* att;       // (N, C)
        Real* lse;       // (B, NH, T)
        Real* mid;       // (N, C) residual after attention
        Real* ln2;       // (N, C)
        Real* rstd2;     // (N)
        Real* gu;        // (N, 2F)
        Real* h;         // (N, F)
    };

    // Offsets into the parameter arena, resolved once from the manifest.
    struct LayerOffsets {
        size_t ln1, wqkv, wo, ln2, wgu, wdown;
    };

    LayerWeights layer_weights(Real* base, int l) const;
    void carve_activations();

    ModelConfig config_;
    ParameterManifest manifest_;
    Ops<Real>& ops_;
    int B_, T_;
    std::vector<LayerOffsets> layer_offsets_;
    size_t wte_offset_, norm_offset_, head_offset_;

    Real* params_ = nullptr;
    Real* grads_ = nullptr;
    Real* acts_ = nullptr;
    Real* dacts_ = nullptr;
    size_t act_count_ = 0;
    size_t dact_count_ = 0;
    int32_t* inputs_ = nullptr;   // (N)
    int32_t* targets_ = nullptr;  // (N)

    std::vector<LayerActs> layers_;
    Real* final_residual_ = nullptr;  // (N, C)
    Real* lnf_ = nullptr;             // (N, C)
    Real* rstdf_ = nullptr;           // (N)
    Real* logits_ = nullptr;          // (N, V), becomes dlogits in backward
    Real* losses_ = nullptr;          // (N)

    Real* dres_ = nullptr;  // (N, C) gradient of the residual stream
    Real* dln_ = nullptr;   // (N, C)
    Real* datt_ = nullptr;  // (N, C)
    Real* dqkv_ = nullptr;  // (N, 3C)
    Real* dgu_ = nullptr;   // (N, 2F)
    Real* dh_ = nullptr;    // (N, F)
};

}  // namespace starling
