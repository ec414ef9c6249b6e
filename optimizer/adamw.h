// The inner optimizer: AdamW with decoupled weight decay (matrices only) and global-norm
// gradient clipping, over the flat parameter arena. Moments m and v are flat arenas in
// manifest order, so checkpoints and state transfer copy them whole.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/ops.h"
#include "model/manifest.h"

namespace starling {

struct AdamWConfig {
    float beta1 = 0.9f;
    float beta2 = 0.95f;
    float eps = 1e-8f;
    float weight_decay = 0.1f;
    float grad_clip = 1.0f;  // max global L2 norm; 0 disables clipping
    void validate() const;   // throws starling::Error naming the field
};

struct AdamWStepStats {
    double grad_norm = 0.0;  // before clipping
    bool skipped = false;    // the gradient was not finite, so nothing was updated
};

template <typename Real>
class AdamW {
public:
    AdamW(Ops<Real>& ops, const ParameterManifest& manifest, const AdamWConfig& config);
    ~AdamW();
    AdamW(const AdamW&) = delete;
    AdamW& operator=(const AdamW&) = delete;

    // One update of params from grads at learning rate lr. A NaN or Inf gradient norm skips the
    // update (and does not advance the step count) rather than poisoning the weights.
    AdamWStepStats step(Real* params, const Real* grads, float lr);

    Real* m() { return m_; }
    Real* v() { return v_; }
    size_t size() const { return n_; }
    int64_t steps_taken() const { return t_; }
    void set_steps_taken(int64_t t) { t_ = t; }

private:
    Ops<Real>& ops_;
    AdamWConfig config_;
    std::vector<DecaySegment> segments_;
    size_t n_;
    Real* m_;
    Real* v_;
    int64_t t_ = 0;
};

}  // namespace starling
