#include "experiment/evaluator.h"

#include <algorithm>

#include "common/error.h"
#include "data/loader.h"
#include "data/shard.h"

namespace starling {

Evaluator::Evaluator(const ExperimentConfig& config, Ops<float>& ops) {
    const int B = config.train.batch_size, T = config.train.effective_seq_len();
    model_ = std::make_unique<Model<float>>(config.train.model, ops, B, T);
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
    double total = 0.0;
    for (size_t i = 0; i < inputs_.size(); i++) {
        total += model_->forward(inputs_[i].data(), targets_[i].data());
    }
    return total / static_cast<double>(inputs_.size());
}

}  // namespace starling
