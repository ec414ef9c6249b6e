#include "daemon/train_checkpoint.h"

#include "common/error.h"
#include "common/atomic_file.h"
#include "model/hf_format.h"
#include "model/safetensors.h"

namespace starling {

namespace {

constexpr const char* kModelFile = "model.safetensors";
constexpr const char* kConfigFile = "config.json";
constexpr const char* kStateFile = "training_state.safetensors";

std::string describe(const ModelConfig& c) { return llama_config_json(c).dump(); }

}  // namespace

void write_training_checkpoint(const std::filesystem::path& dir, const ModelConfig& config,
                               const ParameterManifest& manifest, const TrainingArenas& arenas,
                               const TrainingState& state,
                               const std::optional<std::string>& tokenizer_json) {
    write_hf_model_dir(dir, config, manifest, arenas.params.data(), tokenizer_json);
    const int64_t n = static_cast<int64_t>(manifest.total());
    const uint64_t data_state[2] = {state.data.epoch, state.data.position};
    write_safetensors(dir / kStateFile,
                      {{"adamw.m", DType::F32, {n}, arenas.adam_m.data()},
                       {"adamw.v", DType::F32, {n}, arenas.adam_v.data()},
                       {"adamw.steps", DType::I64, {}, &state.adamw_steps},
                       {"train.step", DType::I64, {}, &state.step},
                       {"data.epoch_position", DType::U64, {2}, data_state},
                       {"rng.seed", DType::U64, {}, &state.seed}},
                      {{"starling.fingerprint", manifest.fingerprint()}});
}

TrainingState read_training_checkpoint(const std::filesystem::path& dir, const ModelConfig& config,
                                       const ParameterManifest& manifest, TrainingArenas& arenas) {
    const std::filesystem::path config_path = dir / kConfigFile;
    const ModelConfig saved = read_llama_config(config_path);
    if (ParameterManifest(saved).fingerprint() != manifest.fingerprint()) {
        throw Error(config_path.string() + ": the checkpoint's model " + describe(saved) +
                    " does not match the configured model " + describe(config));
    }

    const size_t n = manifest.total();
    arenas.params.resize(n);
    arenas.adam_m.resize(n);
    arenas.adam_v.resize(n);
    read_model_safetensors(dir / kModelFile, manifest, arenas.params.data());

    const SafetensorsFile file = SafetensorsFile::open(dir / kStateFile);
    const auto fp = file.metadata().find("starling.fingerprint");
    if (fp == file.metadata().end() || fp->second != manifest.fingerprint()) {
        throw Error(file.path().string() + ": training state written for a different model");
    }
    const std::vector<int64_t> flat = {static_cast<int64_t>(n)};
    file.read_f32("adamw.m", arenas.adam_m, flat);
    file.read_f32("adamw.v", arenas.adam_v, flat);
    TrainingState state;
    uint64_t data_state[2];
    file.read("adamw.steps", DType::I64, {},
              std::as_writable_bytes(std::span(&state.adamw_steps, 1)));
    file.read("train.step", DType::I64, {}, std::as_writable_bytes(std::span(&state.step, 1)));
    file.read("data.epoch_position", DType::U64, {2},
              std::as_writable_bytes(std::span(data_state)));
    file.read("rng.seed", DType::U64, {}, std::as_writable_bytes(std::span(&state.seed, 1)));
    state.data = {data_state[0], data_state[1]};
    if (state.step < 0 || state.adamw_steps < 0 || state.adamw_steps > state.step) {
        throw Error(file.path().string() + ": inconsistent step counters (step " +
                    std::to_string(state.step) + ", adamw steps " +
                    std::to_string(state.adamw_steps) + ")");
    }
    return state;
}

}  // namespace starling
