// Validation loss of any weights: a fixed set of validation batches (the first eval_batches of the
// validation split, in order) read once, and a model of its own to load the weights into, so every
// replica and every round is scored on exactly the same tokens. The model lives on the backend's
// first device, sized for one device's share of a batch, so a node on several GPUs does not hold
// a whole batch's activations on GPU 0; each batch is scored in as many equal parts, which gives
// the same mean.
#pragma once

#include <memory>
#include <span>
#include <vector>

#include "experiment/experiment_config.h"
#include "kernels/backend.h"
#include "model/model.h"

namespace starling {

class Evaluator {
public:
    Evaluator(const ExperimentConfig& config, const Backend& backend);
    double loss(std::span<const float> weights);  // mean cross-entropy in nats per token
    size_t batches() const { return inputs_.size(); }

private:
    std::unique_ptr<Model<float>> model_;
    int parts_;  // of each batch, one model batch each
    std::vector<std::vector<int32_t>> inputs_, targets_;
};

}  // namespace starling
