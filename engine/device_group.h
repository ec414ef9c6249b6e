// The model and AdamW on every device of one node, trained as one model by data parallelism.
// Each step splits the node's batch of B sequences into equal shards, one per device, runs the
// forward and backward passes side by side (a host thread per GPU), averages the gradients with
// the backend's all-reduce and takes the same AdamW step on every device. The mean of the shards'
// mean losses is the batch's mean loss and the mean of their gradients is its gradient, so a step
// is the step of one model on the whole batch, and the devices' weights stay equal.
//
// Device 0, the lead, is where weights and AdamW state are read from; whatever sets them sets
// them on every device. With one device this is plain single-device training.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "common/side_by_side.h"
#include "kernels/backend.h"
#include "model/model.h"
#include "optimizer/adamw.h"

namespace starling {

// B / devices: each device's share of a batch of B sequences. Throws starling::Error naming both
// numbers when B does not split evenly.
int per_device_batch(int B, size_t devices);

class DeviceGroup {
public:
    // B sequences of T tokens per step on the node as a whole; throws starling::Error naming the
    // batch size and the device count when B does not split evenly over the devices.
    DeviceGroup(const Backend& backend, const ModelConfig& model, const AdamWConfig& adamw, int B,
                int T);
    ~DeviceGroup();
    DeviceGroup(const DeviceGroup&) = delete;
    DeviceGroup& operator=(const DeviceGroup&) = delete;

    size_t devices() const { return per_device_.size(); }
    // Device r's model and AdamW; device 0 is the lead.
    Model<float>& model(size_t r) { return *per_device_.at(r).model; }
    AdamW<float>& adamw(size_t r) { return *per_device_.at(r).adamw; }
    Model<float>& lead() { return model(0); }
    const Model<float>& lead() const { return *per_device_.front().model; }
    AdamW<float>& lead_adamw() { return adamw(0); }
    size_t num_params() const { return lead().num_params(); }

    void zero_grad();
    // Adds the gradient of the batch's mean loss into every device's gradient arena (each device
    // adds its shard's, the all-reduce in step() averages them); returns the batch's mean loss.
    // inputs and targets are host arrays of B*T token ids.
    double accumulate_gradients(const int32_t* inputs, const int32_t* targets);
    // Averages the gradients over the devices, scales them by grad_scale, and takes the AdamW
    // step at learning rate lr on every device. Returns the lead's statistics.
    AdamWStepStats step(float lr, float grad_scale = 1.0f);
    // zero_grad, accumulate_gradients and step: one training step on one batch.
    struct StepResult {
        double loss = 0.0;
        AdamWStepStats stats;
    };
    StepResult train_step(const int32_t* inputs, const int32_t* targets, float lr);
    // The batch's mean loss, forward passes only.
    double loss(const int32_t* inputs, const int32_t* targets);

    // Seeded initialisation (Model::init_weights) on the lead, copied to the other devices.
    void init_weights(uint64_t seed);
    // Weights, and AdamW's moments, from host arrays of num_params() floats, on every device.
    void set_params(const float* host);
    void set_moments(const float* m, const float* v);
    void set_steps_taken(int64_t steps);
    // AdamW's moments and step count from another group on the same devices.
    void copy_optimizer_state_from(const DeviceGroup& other);

    // The most device memory any one device has held (0 on the CPU).
    size_t peak_device_bytes() const;

private:
    struct PerDevice {
        Ops<float>* ops;
        std::unique_ptr<Model<float>> model;
        std::unique_ptr<AdamW<float>> adamw;
    };

    // Runs work(r) for every device r: side by side on GPUs, in turn on host-memory backends,
    // whose ops already use every core. Rethrows the first exception once all have finished.
    void for_each_device(const std::function<void(size_t)>& work);
    // Each device's forward pass on its shard (and backward, adding into its gradients); returns
    // the batch's mean loss.
    double forward_shards(const int32_t* inputs, const int32_t* targets, bool backward);

    std::vector<PerDevice> per_device_;
    std::unique_ptr<SideBySide> side_by_side_;  // GPUs only: a host thread per device
    AllReduce* all_reduce_;
    int shard_B_, T_;
};

}  // namespace starling
