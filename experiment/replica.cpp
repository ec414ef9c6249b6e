#include "experiment/replica.h"

#include <algorithm>

#include "data/shard.h"

namespace starling {

std::unique_ptr<DataLoader> make_train_loader(const ExperimentConfig& config, int index,
                                              uint64_t node_id) {
    DataLoaderOptions options;
    options.shard_paths = list_shards(config.train.data.dir, "train");
    options.B = config.train.batch_size;
    options.T = config.train.effective_seq_len();
    options.node_id = node_id;
    options.partition_index = static_cast<uint32_t>(index);
    options.partition_count = static_cast<uint32_t>(config.replicas);
    return std::make_unique<DataLoader>(options);
}

Replica::Replica(const ExperimentConfig& config, Ops<float>& ops, int index, uint64_t node_id)
    : config_(config), index_(index), node_id_(node_id) {
    const int B = config.train.batch_size, T = config.train.effective_seq_len();
    model_ = std::make_unique<Model<float>>(config.train.model, ops, B, T);
    adamw_ = std::make_unique<AdamW<float>>(ops, model_->manifest(), config.train.adamw);
    data_ = make_train_loader(config, index, node_id);
    inputs_.resize(static_cast<size_t>(B) * T);
    targets_.resize(inputs_.size());
    model_->init_weights(config.train.seed);
    const size_t n = model_->num_params();
    if (!ops.host_memory()) {
        theta_mirror_.resize(n);
        refresh_theta_mirror();
    }
    phi_.assign(theta().begin(), theta().end());
    momentum_.assign(n, 0.0f);
    residual_.assign(n, 0.0f);
    displacement_.assign(n, 0.0f);
}

double Replica::inner_phase(int steps, const LrSchedule& schedule) {
    double total = 0.0;
    for (int h = 0; h < steps; h++) {
        data_->next_batch(inputs_.data(), targets_.data());
        total += model_->forward(inputs_.data(), targets_.data());
        model_->zero_grad();
        model_->backward();
        adamw_->step(model_->params(), model_->grads(), schedule.lr_at(inner_step_));
        inner_step_++;
    }
    refresh_theta_mirror();
    return total / steps;
}

double Replica::averaged_gradient_phase(int steps, const LrSchedule& schedule,
                                        std::span<const std::unique_ptr<DataLoader>> streams) {
    double total = 0.0;
    for (int h = 0; h < steps; h++) {
        model_->zero_grad();
        for (const auto& stream : streams) {
            stream->next_batch(inputs_.data(), targets_.data());
            total += model_->forward(inputs_.data(), targets_.data());
            model_->backward();  // adds into the gradient arena
        }
        model_->ops().scale(model_->grads(), 1.0f / static_cast<float>(streams.size()), size());
        adamw_->step(model_->params(), model_->grads(), schedule.lr_at(inner_step_));
        inner_step_++;
    }
    refresh_theta_mirror();
    return total / (static_cast<double>(steps) * static_cast<double>(streams.size()));
}

std::span<const float> Replica::theta() const {
    if (model_->ops().host_memory()) return {model_->params(), size()};
    return theta_mirror_;
}

void Replica::refresh_theta_mirror() {
    if (!theta_mirror_.empty()) model_->ops().to_host(theta_mirror_.data(), model_->params(), size());
}

std::span<const float> Replica::host_view(const float* arena, std::vector<float>& mirror) {
    if (model_->ops().host_memory()) return {arena, size()};
    mirror.resize(size());
    model_->ops().to_host(mirror.data(), arena, size());
    return mirror;
}

std::span<const float> Replica::adamw_m_host() {
    return host_view(adamw_->m(), adamw_m_mirror_);
}

std::span<const float> Replica::adamw_v_host() {
    return host_view(adamw_->v(), adamw_v_mirror_);
}

void Replica::set_adamw_moments(std::span<const float> m, std::span<const float> v) {
    model_->ops().from_host(adamw_->m(), m.data(), size());
    model_->ops().from_host(adamw_->v(), v.data(), size());
}

void Replica::compute_displacement() {
    const std::span<const float> t = theta();
    for (size_t i = 0; i < phi_.size(); i++) displacement_[i] = t[i] - phi_[i];
}

void Replica::restart_from_phi() {
    model_->ops().from_host(model_->params(), phi_.data(), size());
    if (!theta_mirror_.empty()) theta_mirror_ = phi_;
}

void Replica::adopt_theta() {
    const std::span<const float> t = theta();
    std::copy(t.begin(), t.end(), phi_.begin());
}

void Replica::rejoin_from(const Replica& sponsor, uint64_t new_node_id) {
    phi_ = sponsor.phi_;
    momentum_ = sponsor.momentum_;
    model_->ops().copy(adamw_->m(), sponsor.adamw_->m(), size());
    model_->ops().copy(adamw_->v(), sponsor.adamw_->v(), size());
    adamw_->set_steps_taken(sponsor.adamw_->steps_taken());
    inner_step_ = sponsor.inner_step_;
    std::fill(residual_.begin(), residual_.end(), 0.0f);
    restart_from_phi();
    node_id_ = new_node_id;
    data_ = make_train_loader(config_, index_, node_id_);
    checks_ = PartnerChecks();
}

size_t Replica::snapshot_bytes() const {
    return 4 * size() * sizeof(float);  // phi, outer momentum, AdamW m and v
}

}  // namespace starling
