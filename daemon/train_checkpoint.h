// One training checkpoint directory: model.safetensors and config.json (Hugging Face form, see
// model/hf_format.h) plus training_state.safetensors with everything else a resumed run needs to
// continue bit for bit: AdamW moments and step count, the data cursor and the RNG seed.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "data/loader.h"
#include "model/config.h"
#include "model/manifest.h"

namespace starling {

struct TrainingState {
    int64_t step = 0;         // optimizer steps completed; the next step to run
    int64_t adamw_steps = 0;  // AdamW's bias-correction count (lags step when steps were skipped)
    LoaderState data;
    uint64_t seed = 0;
};

// Host copies of the flat arenas, in manifest order.
struct TrainingArenas {
    std::vector<float> params, adam_m, adam_v;
};

// tokenizer_json: the vocabulary's tokenizer.json, written beside the model when given.
void write_training_checkpoint(const std::filesystem::path& dir, const ModelConfig& config,
                               const ParameterManifest& manifest, const TrainingArenas& arenas,
                               const TrainingState& state,
                               const std::optional<std::string>& tokenizer_json);

// Checks that the checkpoint was written for this model (config.json and fingerprint) before
// reading anything into arenas; every problem names the file.
TrainingState read_training_checkpoint(const std::filesystem::path& dir, const ModelConfig& config,
                                       const ParameterManifest& manifest, TrainingArenas& arenas);

}  // namespace starling
