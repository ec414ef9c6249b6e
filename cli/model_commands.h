// `starling export` and `starling sample`: the model a node trained, out of its checkpoints. The
// source is a node's config (its model and data directory) with the newest checkpoint that reads
// back whole or one named, or a Hugging Face directory (an export, or a `starling train`
// checkpoint step). Neither writes anything under the node's data directory, so both are safe
// while starlingd runs.
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "model/config.h"
#include "model/generate.h"

namespace starling::cli {

struct ModelSource {
    std::optional<std::filesystem::path> config_path;     // a node's config (with data_dir, checkpoint)
    std::optional<std::filesystem::path> data_dir;        // overrides [node].data_dir
    std::optional<std::filesystem::path> checkpoint;      // one swarm checkpoint directory (step_*)
    std::optional<std::filesystem::path> hf_dir;          // or a Hugging Face model directory
};

struct LoadedModel {
    ModelConfig config;
    std::vector<float> params;  // phi of the checkpoint, in manifest order
    std::string origin;         // "round 120 of out/node/checkpoints/step_00000120"
};

// Throws starling::Error naming the file and what is wrong: no source or two, no checkpoint, a
// corrupt or other model's checkpoint.
LoadedModel load_model(const ModelSource& source);

// Writes the source's model to `out` as a Hugging Face directory; prints what it wrote.
int run_export(const ModelSource& source, const std::filesystem::path& out);

// Prints the prompt and its continuation (byte vocabulary only).
int run_sample(const ModelSource& source, const std::string& prompt, const SampleOptions& options);

}  // namespace starling::cli
