#include "engine/device_group.h"

#include <algorithm>
#include <string>

#include "common/error.h"

namespace starling {

int per_device_batch(int B, size_t devices) {
    const int count = static_cast<int>(devices);
    if (count == 0) throw Error("device group: the backend has no device");
    if (B % count != 0) {
        throw Error("batch_size " + std::to_string(B) + " does not split evenly over " +
                    std::to_string(count) + " devices: make it a multiple of " +
                    std::to_string(count));
    }
    return B / count;
}

DeviceGroup::DeviceGroup(const Backend& backend, const ModelConfig& model, const AdamWConfig& adamw,
                         int B, int T)
    : all_reduce_(backend.all_reduce.get()),
      shard_B_(per_device_batch(B, backend.devices.size())),
      T_(T) {
    const size_t count = backend.devices.size();
    if (count > 1 && all_reduce_ == nullptr) {
        throw Error("device group: " + std::to_string(count) + " devices but no all-reduce");
    }
    for (const auto& ops : backend.devices) {
        PerDevice d;
        d.ops = ops.get();
        d.model = std::make_unique<Model<float>>(model, *d.ops, shard_B_, T);
        d.adamw = std::make_unique<AdamW<float>>(*d.ops, d.model->manifest(), adamw);
        per_device_.push_back(std::move(d));
    }
    if (count > 1 && !backend.lead().host_memory()) {
        side_by_side_ = std::make_unique<SideBySide>(per_device_.size());
    }
}

DeviceGroup::~DeviceGroup() = default;

void DeviceGroup::for_each_device(const std::function<void(size_t)>& work) {
    if (side_by_side_) {
        side_by_side_->run(work);
        return;
    }
    for (size_t r = 0; r < per_device_.size(); r++) work(r);
}

void DeviceGroup::zero_grad() {
    for (PerDevice& d : per_device_) d.model->zero_grad();
}

double DeviceGroup::forward_shards(const int32_t* inputs, const int32_t* targets, bool backward) {
    const size_t shard = static_cast<size_t>(shard_B_) * static_cast<size_t>(T_);
    std::vector<double> losses(per_device_.size());
    for_each_device([&](size_t r) {
        Model<float>& model = *per_device_[r].model;
        losses[r] = model.forward(inputs + r * shard, targets + r * shard);
        if (backward) model.backward();
    });
    // Equal shards: the mean of their mean losses is the batch's mean loss.
    double total = 0.0;
    for (const double loss : losses) total += loss;
    return total / static_cast<double>(losses.size());
}

double DeviceGroup::accumulate_gradients(const int32_t* inputs, const int32_t* targets) {
    return forward_shards(inputs, targets, true);
}

AdamWStepStats DeviceGroup::step(float lr, float grad_scale) {
    const size_t n = num_params();
    if (per_device_.size() > 1) {
        std::vector<float*> grads;
        for (PerDevice& d : per_device_) grads.push_back(d.model->grads());
        all_reduce_->average(grads, n);
    }
    std::vector<AdamWStepStats> stats(per_device_.size());
    for_each_device([&](size_t r) {
        PerDevice& d = per_device_[r];
        if (grad_scale != 1.0f) d.ops->scale(d.model->grads(), grad_scale, n);
        stats[r] = d.adamw->step(d.model->params(), d.model->grads(), lr);
    });
    return stats.front();
}

DeviceGroup::StepResult DeviceGroup::train_step(const int32_t* inputs, const int32_t* targets,
                                                float lr) {
    zero_grad();
    StepResult result;
    result.loss = accumulate_gradients(inputs, targets);
    result.stats = step(lr);
    return result;
}

double DeviceGroup::loss(const int32_t* inputs, const int32_t* targets) {
    return forward_shards(inputs, targets, false);
}

void DeviceGroup::init_weights(uint64_t seed) {
    lead().init_weights(seed);
    if (per_device_.size() == 1) return;
    std::vector<float> host(num_params());
    per_device_.front().ops->to_host(host.data(), lead().params(), host.size());
    for (size_t r = 1; r < per_device_.size(); r++) {
        per_device_[r].ops->from_host(per_device_[r].model->params(), host.data(), host.size());
    }
}

void DeviceGroup::set_params(const float* host) {
    for (PerDevice& d : per_device_) d.ops->from_host(d.model->params(), host, num_params());
}

void DeviceGroup::set_moments(const float* m, const float* v) {
    for (PerDevice& d : per_device_) {
        d.ops->from_host(d.adamw->m(), m, num_params());
        d.ops->from_host(d.adamw->v(), v, num_params());
    }
}

void DeviceGroup::set_steps_taken(int64_t steps) {
    for (PerDevice& d : per_device_) d.adamw->set_steps_taken(steps);
}

void DeviceGroup::copy_optimizer_state_from(const DeviceGroup& other) {
    if (other.per_device_.size() != per_device_.size()) {
        throw Error("device group: cannot copy optimizer state from a group of " +
                    std::to_string(other.per_device_.size()) + " devices to one of " +
                    std::to_string(per_device_.size()));
    }
    for (size_t r = 0; r < per_device_.size(); r++) {
        PerDevice& d = per_device_[r];
        const PerDevice& from = other.per_device_[r];
        d.ops->copy(d.adamw->m(), from.adamw->m(), num_params());
        d.ops->copy(d.adamw->v(), from.adamw->v(), num_params());
        d.adamw->set_steps_taken(from.adamw->steps_taken());
    }
}

size_t DeviceGroup::peak_device_bytes() const {
    size_t peak = 0;
    for (const PerDevice& d : per_device_) peak = std::max(peak, backend_device_peak_bytes(*d.ops));
    return peak;
}

}  // namespace starling
