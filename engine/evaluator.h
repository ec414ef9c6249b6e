// Validation loss, one way for every caller: a fixed set of validation batches (the first
// eval_batches of the validation split, in order) read once, so every replica, every round and
// every training step is scored on exactly the same tokens.
//
// Weights held elsewhere (a replica's phi, a swarm node's phi) are loaded into a model of the
// evaluator's own, made at the first such call on the backend's first device and sized for one
// device's share of a batch, so a node on several GPUs does not hold a whole batch's activations
// on GPU 0; each batch is scored in as many equal parts, which gives the same mean. A device group
// that holds the weights already (the single-node trainer) is scored where it is.
#pragma once

#include <memory>
#include <span>
#include <vector>

#include "engine/config.h"
#include "engine/device_group.h"
#include "kernels/backend.h"
#include "model/model.h"

namespace starling {

class Evaluator {
public:
    Evaluator(const TrainConfig& train, const Backend& backend);
    // Scores `count` validation batches from batch `first` on instead, where the split holds
    // them; one that holds fewer wraps around (to the first eval_batches, if it must).
    Evaluator(const TrainConfig& train, const Backend& backend, uint64_t first, uint64_t count);
    // Mean cross-entropy in nats per token of the given weights.
    double loss(std::span<const float> weights);
    // Mean cross-entropy of the group's own weights, forward passes only.
    double loss(DeviceGroup& group);
    size_t batches() const { return inputs_.size(); }

private:
    TrainConfig train_;
    const Backend& backend_;
    int part_batch_;                       // sequences of one part of a batch: one device's share
    std::unique_ptr<Model<float>> model_;  // made at the first loss(weights)
    std::vector<std::vector<int32_t>> inputs_, targets_;
};

}  // namespace starling
