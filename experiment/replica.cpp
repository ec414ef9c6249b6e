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
    phi_.assign(model_->params(), model_->params() + n);
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
    return total / (static_cast<double>(steps) * static_cast<double>(streams.size()));
}

void Replica::compute_displacement() {
    const float* theta = model_->params();
    for (size_t i = 0; i < phi_.size(); i++) displacement_[i] = theta[i] - phi_[i];
}

void Replica::restart_from_phi() {
    std::copy(phi_.begin(), phi_.end(), model_->params());
}

void Replica::adopt_theta() {
    std::copy(model_->params(), model_->params() + size(), phi_.begin());
}

void Replica::rejoin_from(const Replica& sponsor, uint64_t new_node_id) {
    phi_ = sponsor.phi_;
    momentum_ = sponsor.momentum_;
    std::copy(sponsor.adamw_->m(), sponsor.adamw_->m() + size(), adamw_->m());
    std::copy(sponsor.adamw_->v(), sponsor.adamw_->v() + size(), adamw_->v());
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
