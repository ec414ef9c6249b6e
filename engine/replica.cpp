#include "engine/replica.h"

#include <algorithm>
#include <spdlog/spdlog.h>
#include <utility>

#include "common/error.h"

#include "data/prepare.h"
#include "data/shard.h"
#include "optimizer/outer.h"

namespace starling {

std::unique_ptr<DataLoader> make_train_loader(const TrainConfig& train, int partitions, int index,
                                              uint64_t node_id) {
    check_shards_tokenizer(train.data.dir, train.data.tokenizer);
    DataLoaderOptions options;
    options.shard_paths = list_shards(train.data.dir, "train");
    options.B = train.batch_size;
    options.T = train.effective_seq_len();
    options.node_id = node_id;
    options.partition_index = static_cast<uint32_t>(index);
    options.partition_count = static_cast<uint32_t>(partitions);
    return std::make_unique<DataLoader>(options);
}

Replica::Replica(const TrainConfig& train, int partitions, const Backend& backend, int index,
                 uint64_t node_id)
    : train_(train), partitions_(partitions), index_(index), node_id_(node_id), backend_(&backend) {
    const int B = train.batch_size, T = train.effective_seq_len();
    group_ = std::make_unique<DeviceGroup>(backend, train.model, train.adamw, B, T);
    data_ = make_train_loader(train, partitions, index, node_id);
    inputs_.resize(static_cast<size_t>(B) * T);
    targets_.resize(inputs_.size());
    group_->init_weights(train.seed);
    const size_t n = group_->num_params();
    if (!backend.lead().host_memory()) {
        theta_mirror_.resize(n);
        refresh_theta_mirror();
    }
    phi_.assign(theta().begin(), theta().end());
    momentum_.assign(n, 0.0f);
    residual_.assign(n, 0.0f);
    displacement_.assign(n, 0.0f);
}

double Replica::inner_phase(int steps, const LrSchedule& schedule, int schedule_steps) {
    double total = 0.0;
    for (int h = 0; h < steps; h++) {
        data_->next_batch(inputs_.data(), targets_.data());
        const int64_t at = inner_step_ + int64_t(h) * schedule_steps / steps;
        total += group_->train_step(inputs_.data(), targets_.data(), schedule.lr_at(at)).loss;
    }
    inner_step_ += schedule_steps;
    refresh_theta_mirror();
    return total / steps;
}

double Replica::averaged_gradient_phase(int steps, const LrSchedule& schedule,
                                        std::span<const std::unique_ptr<DataLoader>> streams) {
    double total = 0.0;
    for (int h = 0; h < steps; h++) {
        group_->zero_grad();
        for (const auto& stream : streams) {
            stream->next_batch(inputs_.data(), targets_.data());
            total += group_->accumulate_gradients(inputs_.data(), targets_.data());
        }
        group_->step(schedule.lr_at(inner_step_), 1.0f / static_cast<float>(streams.size()));
        inner_step_++;
    }
    refresh_theta_mirror();
    return total / (static_cast<double>(steps) * static_cast<double>(streams.size()));
}

std::span<const float> Replica::theta() const {
    // The mirror exists exactly where the backend's memory is not host memory.
    if (theta_mirror_.empty()) return {std::as_const(*group_).lead().params(), size()};
    return theta_mirror_;
}

void Replica::refresh_theta_mirror() {
    Model<float>& lead = group_->lead();
    if (!theta_mirror_.empty()) lead.ops().to_host(theta_mirror_.data(), lead.params(), size());
}

std::span<const float> Replica::host_view(const float* arena, std::vector<float>& mirror) {
    Ops<float>& ops = group_->lead().ops();
    if (ops.host_memory()) return {arena, size()};
    mirror.resize(size());
    ops.to_host(mirror.data(), arena, size());
    return mirror;
}

std::span<const float> Replica::adamw_m_host() {
    return host_view(group_->lead_adamw().m(), adamw_m_mirror_);
}

std::span<const float> Replica::adamw_v_host() {
    return host_view(group_->lead_adamw().v(), adamw_v_mirror_);
}

void Replica::set_adamw_moments(std::span<const float> m, std::span<const float> v) {
    group_->set_moments(m.data(), v.data());
}

void Replica::compute_displacement() {
    const std::span<const float> t = theta();
    for (size_t i = 0; i < phi_.size(); i++) displacement_[i] = t[i] - phi_[i];
}

void Replica::restart_from(std::span<const float> start) {
    group_->set_params(start.data());
    if (!theta_mirror_.empty()) theta_mirror_.assign(start.begin(), start.end());
}

void Replica::restart_from_phi(bool with_residual) {
    if (!with_residual) return restart_from(phi_);
    std::vector<float> start(phi_.size());
    for (size_t i = 0; i < start.size(); i++) start[i] = phi_[i] + residual_[i];
    restart_from(start);
}

void Replica::rebase_onto_phi(std::span<const float> start, bool with_residual) {
    const std::span<const float> t = theta();
    std::vector<float> rebased(t.begin(), t.end());
    starling::rebase_onto_phi<float>(rebased, phi_, start);
    if (with_residual)
        for (size_t i = 0; i < rebased.size(); i++) rebased[i] += residual_[i];
    group_->set_params(rebased.data());
    if (!theta_mirror_.empty()) theta_mirror_ = std::move(rebased);
}

void Replica::adopt_theta() {
    const std::span<const float> t = theta();
    std::copy(t.begin(), t.end(), phi_.begin());
}

void Replica::rejoin_from(const Replica& sponsor, uint64_t new_node_id) {
    phi_ = sponsor.phi_;
    momentum_ = sponsor.momentum_;
    group_->copy_optimizer_state_from(*sponsor.group_);
    inner_step_ = sponsor.inner_step_;
    std::fill(residual_.begin(), residual_.end(), 0.0f);
    restart_from_phi();
    node_id_ = new_node_id;
    data_ = make_train_loader(train_, partitions_, index_, node_id_);
    checks_ = PartnerChecks();
}

bool Replica::held_out_available() {
    if (held_out_ || held_out_missing_) return !held_out_missing_;
    try {
        held_out_ = std::make_unique<Evaluator>(
            train_, *backend_, static_cast<uint64_t>(std::max(train_.eval_batches, 0)), 1);
    } catch (const Error& e) {
        spdlog::warn("partners' weights go unscored on a held-out batch: {}", e.what());
        held_out_missing_ = true;
    }
    return !held_out_missing_;
}

double Replica::held_out_loss(std::span<const float> weights) {
    if (!held_out_available()) throw Error("replica: no held-out batch to score weights on");
    return held_out_->loss(weights);
}

size_t Replica::snapshot_bytes() const {
    return 4 * size() * sizeof(float);  // phi, outer momentum, AdamW m and v
}

}  // namespace starling
