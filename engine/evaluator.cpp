#include "engine/evaluator.h"

#include <algorithm>

#include "common/error.h"
#include "data/loader.h"
#include "data/shard.h"

namespace starling {

Evaluator::Evaluator(const TrainConfig& train, const Backend& backend)
    : Evaluator(train, backend, 0, static_cast<uint64_t>(std::max(train.eval_batches, 0))) {}

Evaluator::Evaluator(const TrainConfig& train, const Backend& backend, uint64_t first,
                     uint64_t count)
    : train_(train), backend_(backend) {
    const int B = train.batch_size, T = train.effective_seq_len();
    // Refused here, not at the first loss(weights): a batch the devices cannot share.
    part_batch_ = per_device_batch(B, backend.devices.size());
    DataLoaderOptions options;
    options.shard_paths = list_shards(train.data.dir, "val");
    options.B = B;
    options.T = T;
    options.shuffle = false;
    DataLoader val(options);
    const uint64_t available = val.sequences_per_epoch() / static_cast<uint64_t>(B);
    count = std::min(available, count);
    if (count == 0)
        throw Error("evaluator: the validation split of " + train.data.dir +
                    " holds less than one batch of " + std::to_string(B) + " x " +
                    std::to_string(T) + " tokens");
    std::vector<int32_t> skipped(static_cast<size_t>(B) * T), skipped_targets(skipped.size());
    for (uint64_t i = 0; i < first % available; i++)
        val.next_batch(skipped.data(), skipped_targets.data());
    for (uint64_t i = 0; i < count; i++) {
        inputs_.emplace_back(static_cast<size_t>(B) * T);
        targets_.emplace_back(static_cast<size_t>(B) * T);
        val.next_batch(inputs_.back().data(), targets_.back().data());
    }
}

double Evaluator::loss(std::span<const float> weights) {
    const size_t parts = backend_.devices.size();
    if (!model_) {
        model_ = std::make_unique<Model<float>>(train_.model, backend_.lead(), part_batch_,
                                                train_.effective_seq_len());
    }
    if (weights.size() != model_->num_params()) {
        throw Error("evaluator: weights of " + std::to_string(weights.size()) +
                    " values for a model of " + std::to_string(model_->num_params()));
    }
    model_->ops().from_host(model_->params(), weights.data(), weights.size());
    const size_t part =
        static_cast<size_t>(model_->batch_size()) * static_cast<size_t>(model_->seq_len());
    double total = 0.0;
    for (size_t i = 0; i < inputs_.size(); i++) {
        for (size_t p = 0; p < parts; p++) {
            total += model_->forward(inputs_[i].data() + p * part, targets_[i].data() + p * part);
        }
    }
    return total / static_cast<double>(inputs_.size() * parts);
}

double Evaluator::loss(DeviceGroup& group) {
    double total = 0.0;
    for (size_t i = 0; i < inputs_.size(); i++)
        total += group.loss(inputs_[i].data(), targets_[i].data());
    return total / static_cast<double>(inputs_.size());
}

}  // namespace starling
