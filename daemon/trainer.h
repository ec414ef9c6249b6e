// Single-node training: the inner loop the swarm's rounds are built on. Owns the backend, the
// model and AdamW on each of its devices (engine/device_group.h), the training data, the
// evaluator and the checkpoint directory of one run.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "daemon/checkpoint_dir.h"
#include "daemon/config.h"
#include "data/loader.h"
#include "kernels/backend.h"
#include "engine/device_group.h"
#include "engine/evaluator.h"

namespace starling {

struct StepRecord {
    int64_t step = 0;  // 1-based: the step that just completed
    double loss = 0.0;
    float lr = 0.0f;
    double grad_norm = 0.0;
    bool skipped = false;
};

struct TrainSummary {
    std::vector<StepRecord> steps;   // the steps this run executed
    std::optional<double> val_loss;  // the last evaluation
    double tokens_per_second = 0.0;  // training steps only, excluding evaluation and checkpoints
};

class Trainer {
public:
    // Builds everything from the config and resumes from run_dir's newest checkpoint when
    // config.resume is set and one exists; otherwise initialises from config.seed.
    explicit Trainer(const TrainConfig& config);
    ~Trainer();

    // Trains until config.steps (or stop_after more steps, when given), logging, evaluating and
    // checkpointing as configured.
    TrainSummary run(std::optional<int64_t> stop_after = std::nullopt);
    double evaluate();  // mean loss over the first eval_batches validation batches
    std::filesystem::path save_checkpoint();

    int64_t step() const { return step_; }
    bool resumed() const { return resumed_; }
    Model<float>& model() { return group_->lead(); }  // device 0's

private:
    void resume_from(const std::filesystem::path& dir);

    TrainConfig config_;
    Backend backend_;
    std::unique_ptr<DeviceGroup> group_;
    std::unique_ptr<DataLoader> train_data_;
    std::unique_ptr<Evaluator> evaluator_;
    CheckpointDir checkpoints_;
    LrSchedule schedule_;
    std::vector<int32_t> inputs_, targets_;
    // Written into each checkpoint when the model fits it.
    std::optional<std::string> tokenizer_json_;
    int64_t step_ = 0;
    bool resumed_ = false;
};

}  // namespace starling
