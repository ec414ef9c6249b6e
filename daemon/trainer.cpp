#include "daemon/trainer.h"

#include <chrono>
#include <cmath>
#include <spdlog/spdlog.h>

#include "daemon/train_checkpoint.h"
#include "data/prepare.h"
#include "data/shard.h"
#include "data/tokenizer.h"
#include "kernels/backend.h"
#include "common/error.h"

namespace starling {

namespace {

using Clock = std::chrono::steady_clock;

std::string format_duration(double seconds) {
    const long s = std::lround(seconds);
    if (s < 60) return std::to_string(s) + "s";
    if (s < 3600) return std::to_string(s / 60) + "m" + std::to_string(s % 60) + "s";
    return std::to_string(s / 3600) + "h" + std::to_string(s % 3600 / 60) + "m";
}

}  // namespace

Trainer::Trainer(const TrainConfig& config)
    : config_(config),
      checkpoints_(config.run_dir, static_cast<size_t>(config.keep_checkpoints)),
      schedule_(config.lr_schedule()) {
    config_.validate();
    backend_ = make_backend({config_.device, config_.threads, config_.matmul});
    spdlog::info("device {}: {}", config_.device, backend_.description);
    const int B = config_.batch_size, T = config_.effective_seq_len();
    group_ = std::make_unique<DeviceGroup>(backend_, config_.model, config_.adamw, B, T);

    check_shards_tokenizer(config_.data.dir, config_.data.tokenizer);
    if (const std::unique_ptr<Tokenizer> tokenizer = load_tokenizer(config_.data.tokenizer);
        tokenizer->fits(config_.model.vocab_size))
        tokenizer_json_ = tokenizer->hf_json();

    DataLoaderOptions train;
    train.shard_paths = list_shards(config_.data.dir, "train");
    train.B = B;
    train.T = T;
    train.node_id = config_.data.node_id;
    train.partition_index = config_.data.partition_index;
    train.partition_count = config_.data.partition_count;
    train_data_ = std::make_unique<DataLoader>(train);

    evaluator_ = std::make_unique<Evaluator>(config_, backend_);

    inputs_.resize(static_cast<size_t>(B) * T);
    targets_.resize(inputs_.size());

    const std::optional<std::filesystem::path> latest =
        config_.resume ? checkpoints_.latest() : std::nullopt;
    if (latest) {
        resume_from(*latest);
    } else {
        group_->init_weights(config_.seed);
    }
    const Model<float>& model = group_->lead();
    spdlog::info(
        "model: {} layers, d_model {}, {} heads, d_ff {}, vocab {}, {} parameters, "
        "fingerprint {}",
        config_.model.n_layer, config_.model.d_model, config_.model.n_head, config_.model.d_ff,
        config_.model.vocab_size, model.num_params(), model.manifest().fingerprint());
    spdlog::info(
        "batch {} x {} tokens, activations {:.1f} MiB per device on {} device(s), {} "
        "training sequences",
        B, T, model.activation_bytes() / 1048576.0, group_->devices(),
        train_data_->sequences_per_epoch());
    if (const size_t device_bytes = backend_device_bytes_in_use(backend_.lead())) {
        spdlog::info(
            "device memory: {:.1f} MiB allocated per device (parameters, gradients, "
            "AdamW moments and activations)",
            device_bytes / 1048576.0);
    }
}

Trainer::~Trainer() = default;

void Trainer::resume_from(const std::filesystem::path& dir) {
    TrainingArenas arenas;
    const TrainingState state =
        read_training_checkpoint(dir, config_.model, group_->lead().manifest(), arenas);
    if (state.seed != config_.seed) {
        throw Error(dir.string() + ": the checkpoint was trained with seed " +
                    std::to_string(state.seed) + " but the config says " +
                    std::to_string(config_.seed));
    }
    group_->set_params(arenas.params.data());
    group_->set_moments(arenas.adam_m.data(), arenas.adam_v.data());
    group_->set_steps_taken(state.adamw_steps);
    train_data_->restore(state.data);
    step_ = state.step;
    resumed_ = true;
    spdlog::info("resumed from {} at step {}", dir.string(), step_);
}

std::filesystem::path Trainer::save_checkpoint() {
    const size_t n = group_->num_params();
    Model<float>& model = group_->lead();
    AdamW<float>& adamw = group_->lead_adamw();
    TrainingArenas arenas;
    arenas.params.resize(n);
    arenas.adam_m.resize(n);
    arenas.adam_v.resize(n);
    model.ops().to_host(arenas.params.data(), model.params(), n);
    model.ops().to_host(arenas.adam_m.data(), adamw.m(), n);
    model.ops().to_host(arenas.adam_v.data(), adamw.v(), n);
    TrainingState state;
    state.step = step_;
    state.adamw_steps = adamw.steps_taken();
    state.data = train_data_->state();
    state.seed = config_.seed;
    return checkpoints_.save(static_cast<uint64_t>(step_), [&](const std::filesystem::path& dir) {
        write_training_checkpoint(dir, config_.model, model.manifest(), arenas, state,
                                  tokenizer_json_);
    });
}

double Trainer::evaluate() { return evaluator_->loss(*group_); }

TrainSummary Trainer::run(std::optional<int64_t> stop_after) {
    TrainSummary summary;
    const int64_t last = stop_after ? std::min(config_.steps, step_ + *stop_after) : config_.steps;
    const double tokens_per_step = static_cast<double>(inputs_.size());
    double train_seconds = 0.0, window_seconds = 0.0, window_loss = 0.0;
    int window_steps = 0;
    while (step_ < last) {
        const auto start = Clock::now();
        train_data_->next_batch(inputs_.data(), targets_.data());
        StepRecord record;
        record.lr = schedule_.lr_at(step_);
        const auto [loss, stats] = group_->train_step(inputs_.data(), targets_.data(), record.lr);
        step_++;
        const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
        train_seconds += seconds;
        window_seconds += seconds;
        window_loss += loss;
        window_steps++;
        record.step = step_;
        record.loss = loss;
        record.grad_norm = stats.grad_norm;
        record.skipped = stats.skipped;
        summary.steps.push_back(record);
        if (stats.skipped) {
            spdlog::warn("step {}: gradient norm is {}, update skipped", step_, stats.grad_norm);
        }

        if (step_ % config_.log_every == 0 || step_ == last) {
            const double step_time = window_seconds / window_steps;
            spdlog::info(
                "step {:>6}/{} | loss {:.4f} | lr {:.2e} | norm {:.3f} | {:.0f} tok/s | "
                "{} left",
                step_, config_.steps, window_loss / window_steps, record.lr, stats.grad_norm,
                tokens_per_step / step_time,
                format_duration(step_time * static_cast<double>(config_.steps - step_)));
            window_seconds = window_loss = 0.0;
            window_steps = 0;
        }
        const bool final_step = step_ == config_.steps;
        if ((config_.eval_every > 0 && step_ % config_.eval_every == 0) || final_step) {
            summary.val_loss = evaluate();
            spdlog::info("step {:>6}/{} | val loss {:.4f}", step_, config_.steps,
                         *summary.val_loss);
        }
        if ((config_.checkpoint_every > 0 && step_ % config_.checkpoint_every == 0) || final_step) {
            spdlog::info("checkpoint {}", save_checkpoint().string());
        }
    }
    if (train_seconds > 0.0) {
        summary.tokens_per_second = tokens_per_step * summary.steps.size() / train_seconds;
    }
    if (const size_t peak = group_->peak_device_bytes()) {
        spdlog::info("peak device memory {:.1f} MiB (the most on any one device)",
                     peak / 1048576.0);
    }
    return summary;
}

}  // namespace starling
