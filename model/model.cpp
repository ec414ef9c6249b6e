#include "model/model.h"

#include <cmath>
#include <string>

#include "common/error.h"
#include "common/random.h"

namespace starling {

namespace {

// Hands out consecutive slices of an arena; with a null base it only counts, so the same code
// both sizes an arena and lays it out.
template <typename Real>
struct Carver {
    Real* base;
    size_t used = 0;
    Real* take(size_t n) {
        Real* p = base ? base + used : nullptr;
        used += n;
        return p;
    }
};

}  // namespace

template <typename Real>
Model<Real>::Model(const ModelConfig& config, Ops<Real>& ops, int B, int T)
    : config_(config), manifest_(config), ops_(ops), B_(B), T_(T) {
    if (B < 1) throw Error("model: batch size must be at least 1, got " + std::to_string(B));
    if (T < 1 || T > config.context) {
        throw Error("model: sequence length " + std::to_string(T) + " must be in [1, context " +
                    std::to_string(config.context) + "]");
    }
    for (int l = 0; l < config.n_layer; l++) {
        const std::string p = "model.layers." + std::to_string(l) + ".";
        auto at = [&](const char* name) { return manifest_.find(p + name).offset; };
        layer_offsets_.push_back({at("input_layernorm.weight"), at("self_attn.q_proj.weight"),
                                  at("self_attn.o_proj.weight"),
                                  at("post_attention_layernorm.weight"), at("mlp.gate_proj.weight"),
                                  at("mlp.down_proj.weight")});
    }
    wte_offset_ = manifest_.find("model.embed_tokens.weight").offset;
    norm_offset_ = manifest_.find("model.norm.weight").offset;
    head_offset_ = config.tied_embeddings ? wte_offset_ : manifest_.find("lm_head.weight").offset;
    params_ = ops_.alloc(manifest_.total());
    grads_ = ops_.alloc(manifest_.total());
    carve_activations();
    const size_t N = static_cast<size_t>(B) * T;
    inputs_ = ops_.alloc_tokens(N);
    targets_ = ops_.alloc_tokens(N);
}

template <typename Real>
Model<Real>::~Model() {
    for (void* p :
         {static_cast<void*>(params_), static_cast<void*>(grads_), static_cast<void*>(acts_),
          static_cast<void*>(dacts_), static_cast<void*>(inputs_), static_cast<void*>(targets_)}) {
        if (p) ops_.release(p);
    }
}

template <typename Real>
void Model<Real>::carve_activations() {
    const size_t N = static_cast<size_t>(B_) * T_, C = config_.d_model, F = config_.d_ff;
    const size_t V = config_.vocab_size, NH = config_.n_head;
    for (int pass = 0; pass < 2; pass++) {
        Carver<Real> a{pass == 0 ? nullptr : acts_};
        layers_.assign(config_.n_layer, LayerActs{});
        for (LayerActs& l : layers_) {
            l.residual = a.take(N * C);
            l.ln1 = a.take(N * C);
            l.rstd1 = a.take(N);
            l.qkv = a.take(N * 3 * C);
            l.att = a.take(N * C);
            l.lse = a.take(N * NH);
            l.mid = a.take(N * C);
            l.ln2 = a.take(N * C);
            l.rstd2 = a.take(N);
            l.gu = a.take(N * 2 * F);
            l.h = a.take(N * F);
        }
        final_residual_ = a.take(N * C);
        lnf_ = a.take(N * C);
        rstdf_ = a.take(N);
        logits_ = a.take(N * V);
        losses_ = a.take(N);

        Carver<Real> d{pass == 0 ? nullptr : dacts_};
        dres_ = d.take(N * C);
        dln_ = d.take(N * C);
        datt_ = d.take(N * C);
        dqkv_ = d.take(N * 3 * C);
        dgu_ = d.take(N * 2 * F);
        dh_ = d.take(N * F);

        if (pass == 0) {
            act_count_ = a.used;
            dact_count_ = d.used;
            acts_ = ops_.alloc(act_count_);
            dacts_ = ops_.alloc(dact_count_);
        }
    }
}

template <typename Real>
size_t Model<Real>::activation_bytes() const {
    return (act_count_ + dact_count_) * sizeof(Real);
}

template <typename Real>
typename Model<Real>::LayerWeights Model<Real>::layer_weights(Real* base, int l) const {
    const LayerOffsets& o = layer_offsets_[l];
    return LayerWeights{base + o.ln1, base + o.wqkv, base + o.wo,
                        base + o.ln2, base + o.wgu,  base + o.wdown};
}

template <typename Real>
void Model<Real>::init_weights(uint64_t seed) {
    std::vector<Real> host(manifest_.total());
    const double residual_std = config_.init_std / std::sqrt(2.0 * config_.n_layer);
    for (const TensorInfo& t : manifest_.tensors()) {
        const bool is_norm = t.shape.size() == 1;
        const bool is_residual_proj = t.name.find("o_proj") != std::string::npos ||
                                      t.name.find("down_proj") != std::string::npos;
        const double std = is_residual_proj ? residual_std : config_.init_std;
        for (size_t i = 0; i < t.numel; i++) {
            const size_t k = t.offset + i;
            host[k] = is_norm ? Real(1) : static_cast<Real>(std * normal_at(seed, k));
        }
    }
    ops_.from_host(params_, host.data(), host.size());
}

template <typename Real>
std::vector<double> Model<Real>::position_losses() {
    std::vector<Real> host(static_cast<size_t>(B_) * T_);
    ops_.to_host(host.data(), losses_, host.size());
    return std::vector<double>(host.begin(), host.end());
}

template <typename Real>
std::vector<Real> Model<Real>::logits_at(int b, int t) {
    if (b < 0 || b >= B_ || t < 0 || t >= T_)
        throw Error("model: logits of sequence " + std::to_string(b) + " position " +
                    std::to_string(t) + " asked of a " + std::to_string(B_) + " x " +
                    std::to_string(T_) + " batch");
    const size_t V = static_cast<size_t>(config_.vocab_size);
    std::vector<Real> host(V);
    ops_.to_host(host.data(), logits_ + (static_cast<size_t>(b) * T_ + t) * V, V);
    return host;
}

template <typename Real>
void Model<Real>::zero_grad() {
    ops_.fill_zero(grads_, manifest_.total());
}

template <typename Real>
double Model<Real>::forward(const int32_t* inputs, const int32_t* targets) {
    const int N = B_ * T_, C = config_.d_model, F = config_.d_ff, V = config_.vocab_size;
    const int NH = config_.n_head;
    const float eps = config_.norm_eps, theta = config_.rope_theta;
    for (int i = 0; i < N; i++) {
        if (inputs[i] < 0 || inputs[i] >= V) {
            throw Error("model: input token " + std::to_string(inputs[i]) + " at position " +
                        std::to_string(i) + " is outside the vocabulary of " + std::to_string(V));
        }
    }
    ops_.tokens_from_host(inputs_, inputs, N);
    ops_.tokens_from_host(targets_, targets, N);

    ops_.embedding_forward(layers_[0].residual, inputs_, params_ + wte_offset_, N, C);
    for (int l = 0; l < config_.n_layer; l++) {
        const LayerWeights w = layer_weights(params_, l);
        LayerActs& a = layers_[l];
        Real* out = l + 1 < config_.n_layer ? layers_[l + 1].residual : final_residual_;
        ops_.rmsnorm_forward(a.ln1, a.rstd1, a.residual, w.ln1, N, C, eps);
        ops_.matmul_forward(a.qkv, a.ln1, w.wqkv, N, C, 3 * C, false);
        ops_.rope_forward(a.qkv, B_, T_, C, NH, theta);
        ops_.attention_forward(a.att, a.lse, a.qkv, B_, T_, C, NH);
        // The residual add rides on the matmul: copy the stream, then accumulate into it.
        ops_.copy(a.mid, a.residual, static_cast<size_t>(N) * C);
        ops_.matmul_forward(a.mid, a.att, w.wo, N, C, C, true);
        ops_.rmsnorm_forward(a.ln2, a.rstd2, a.mid, w.ln2, N, C, eps);
        ops_.matmul_forward(a.gu, a.ln2, w.wgu, N, C, 2 * F, false);
        ops_.swiglu_forward(a.h, a.gu, N, F);
        ops_.copy(out, a.mid, static_cast<size_t>(N) * C);
        ops_.matmul_forward(out, a.h, w.wdown, N, F, C, true);
    }
    ops_.rmsnorm_forward(lnf_, rstdf_, final_residual_, params_ + norm_offset_, N, C, eps);
    ops_.matmul_forward(logits_, lnf_, params_ + head_offset_, N, C, V, false);
    ops_.crossentropy_forward(losses_, logits_, targets_, N, V);
    return ops_.sum(losses_, N) / N;
}

template <typename Real>
void Model<Real>::backward() {
    const int N = B_ * T_, C = config_.d_model, F = config_.d_ff, V = config_.vocab_size;
    const int NH = config_.n_head;
    const float theta = config_.rope_theta;

    Real* dlogits = logits_;
    ops_.crossentropy_backward(dlogits, logits_, targets_, 1.0f / N, N, V);
    ops_.matmul_backward(dln_, grads_ + head_offset_, dlogits, lnf_, params_ + head_offset_, N, C,
                         V, false);
    ops_.fill_zero(dres_, static_cast<size_t>(N) * C);
    ops_.rmsnorm_backward(dres_, grads_ + norm_offset_, dln_, final_residual_,
                          params_ + norm_offset_, rstdf_, N, C);
    for (int l = config_.n_layer - 1; l >= 0; l--) {
        const LayerWeights w = layer_weights(params_, l);
        const LayerWeights dw = layer_weights(grads_, l);
        LayerActs& a = layers_[l];
        // dres_ holds d(loss)/d(layer output) and, since out = mid + mlp(mid), also the direct
        // part of d(loss)/d(mid); rmsnorm_backward adds the part through the MLP branch.
        ops_.matmul_backward(dh_, dw.wdown, dres_, a.h, w.wdown, N, F, C, false);
        ops_.swiglu_backward(dgu_, dh_, a.gu, N, F);
        ops_.matmul_backward(dln_, dw.wgu, dgu_, a.ln2, w.wgu, N, C, 2 * F, false);
        ops_.rmsnorm_backward(dres_, dw.ln2, dln_, a.mid, w.ln2, a.rstd2, N, C);
        ops_.matmul_backward(datt_, dw.wo, dres_, a.att, w.wo, N, C, C, false);
        ops_.attention_backward(dqkv_, datt_, a.qkv, a.att, a.lse, B_, T_, C, NH);
        ops_.rope_backward(dqkv_, B_, T_, C, NH, theta);
        ops_.matmul_backward(dln_, dw.wqkv, dqkv_, a.ln1, w.wqkv, N, C, 3 * C, false);
        ops_.rmsnorm_backward(dres_, dw.ln1, dln_, a.residual, w.ln1, a.rstd1, N, C);
    }
    ops_.embedding_backward(grads_ + wte_offset_, dres_, inputs_, N, C, V);
}

template class Model<float>;
template class Model<double>;

}  // namespace starling
