#include "optimizer/adamw.h"

#include <cmath>

#include "common/error.h"

namespace starling {

void AdamWConfig::validate() const {
    if (!(beta1 >= 0.0f && beta1 < 1.0f)) throw Error("optimizer: beta1 must be in [0, 1)");
    if (!(beta2 >= 0.0f && beta2 < 1.0f)) throw Error("optimizer: beta2 must be in [0, 1)");
    if (!(eps > 0.0f)) throw Error("optimizer: eps must be positive");
    if (!(weight_decay >= 0.0f)) throw Error("optimizer: weight_decay must not be negative");
    if (!(grad_clip >= 0.0f)) throw Error("optimizer: grad_clip must not be negative");
}

template <typename Real>
AdamW<Real>::AdamW(Ops<Real>& ops, const ParameterManifest& manifest, const AdamWConfig& config)
    : ops_(ops), config_(config), segments_(manifest.decay_segments()), n_(manifest.total()) {
    config_.validate();
    m_ = ops_.alloc(n_);
    v_ = ops_.alloc(n_);
}

template <typename Real>
AdamW<Real>::~AdamW() {
    ops_.release(m_);
    ops_.release(v_);
}

template <typename Real>
AdamWStepStats AdamW<Real>::step(Real* params, const Real* grads, float lr) {
    AdamWStepStats stats;
    stats.grad_norm = std::sqrt(ops_.sum_squares(grads, n_));
    if (!std::isfinite(stats.grad_norm)) {
        stats.skipped = true;
        return stats;
    }
    t_++;
    AdamWScalars s;
    s.lr = lr;
    s.beta1 = config_.beta1;
    s.beta2 = config_.beta2;
    s.eps = config_.eps;
    s.bias_correction1 = 1.0f - std::pow(config_.beta1, static_cast<float>(t_));
    s.bias_correction2 = 1.0f - std::pow(config_.beta2, static_cast<float>(t_));
    // Clipping is folded into the update as a scale instead of a separate pass over the grads.
    s.grad_scale = 1.0f;
    if (config_.grad_clip > 0.0f && stats.grad_norm > config_.grad_clip) {
        s.grad_scale = static_cast<float>(config_.grad_clip / stats.grad_norm);
    }
    for (const DecaySegment& seg : segments_) {
        s.weight_decay = seg.decay ? config_.weight_decay : 0.0f;
        ops_.adamw_update(params + seg.offset, m_ + seg.offset, v_ + seg.offset, grads + seg.offset,
                          seg.numel, s);
    }
    return stats;
}

template class AdamW<float>;
template class AdamW<double>;

}  // namespace starling
