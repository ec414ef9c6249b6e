#include "experiment/evaluator.h"

#include <algorithm>

#include "common/error.h"
#include "data/loader.h"
#include "data/shard.h"
#include "optimizer/device_group.h"

namespace starling {

Evaluator::Evaluator(const ExperimentConfig& config, const Backend& backend)
    : parts_(static_cast<int>(backend.devices.size())) {
    const int B = config.train.batch_size, T = config.train.effective_seq_len();
    model_ = std::make_unique<Model<float>>(config.train.model, backend.lead(),
                                            per_device_batch(B, backend.devices.size()), T);
    DataLoaderOptions options;
    options.shard_paths = list_shards(config.train.data.dir, "val");
    options.B = B;
    options.T = T;
    options.shuffle = false;
    DataLoader val(options);
    const uint64_t available = val.sequences_per_epoch() / static_cast<uint64_t>(B);
    const uint64_t count = std::min<uint64_t>(available, config.train.eval_batches);
    for (uint64_t i = 0; i < count; i++) {
        inputs_.emplace_back(static_cast<size_t>(B) * T);
        targets_.emplace_back(static_cast<size_t>(B) * T);
        val.next_batch(inputs_.back().data(), targets_.back().data());
    }
}

double Evaluator::loss(std::span<const float> weights) {
    if (weights.size() != model_->num_params()) {
        throw Error("evaluator: weights of " + std::to_string(weights.size()) +
                    " values for a model of " + std::to_string(model_->num_params()));
    }
    model_->ops().from_host(model_->params(), weights.data(), weights.size());
    const size_t part =
        static_cast<size_t>(model_->batch_size()) * static_cast<size_t>(model_->seq_len());
    double total = 0.0;
    for (size_t i = 0; i < inputs_.size(); i++) {
        for (size_t p = 0; p < static_cast<size_t>(parts_); p++) {
            total += model_->forward(inputs_[i].data() + p * part, targets_[i].data() + p * part);
        }
    }
    return total / static_cast<double>(inputs_.size() * static_cast<size_t>(parts_));
}

}  // namespace starling
