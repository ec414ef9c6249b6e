// `starling export` and `starling sample`: the model a node trained. The source is a node's config
// (its model, data directory and [checkpoint].dir) with the newest checkpoint that reads back
// whole (the node's, else `starling train`'s) or one named,
// a Hugging Face directory (an export, or a `starling train` checkpoint step), or, with neither,
// the running node at the control address (its newest round start, through GetModel). Nothing
// is written under the node's data directory, so all of them are safe while starlingd runs.
#pragma once

#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/error.h"
#include "data/tokenizer.h"
#include "model/config.h"
#include "model/generate.h"

namespace starling::cli {

struct ModelSource {
    // A node's config (with data_dir, checkpoint).
    std::optional<std::filesystem::path> config_path;
    std::optional<std::filesystem::path> data_dir;    // overrides [node].data_dir
    std::optional<std::filesystem::path> checkpoint;  // one checkpoint directory, either kind
    std::optional<std::filesystem::path> hf_dir;      // or a Hugging Face model directory
    std::string control;                              // or else the running node's Control API
    // The model's tokenizer.json, over the source's.
    std::optional<std::filesystem::path> tokenizer;
};

struct LoadedModel {
    ModelConfig config;
    std::vector<float> params;   // phi of the checkpoint, in manifest order
    std::string origin;          // "round 120 of out/node/checkpoints/step_00000120"
    std::string tokenizer_json;  // a live node's tokenizer.json; empty: found by the source's kind
};

// A live node's Control API that failed: the exit status it means (control_client.h) and why.
class ControlCallFailed : public Error {
public:
    ControlCallFailed(int status, const std::string& message) : Error(message), exit_code(status) {}
    int exit_code;
};

// Throws starling::Error naming the file and what is wrong: two sources, no checkpoint, a corrupt
// or other model's checkpoint; ControlCallFailed when the live node does not give its model.
// Checkpoints are a swarm node's (daemon/swarm/swarm_checkpoint.h) or `starling train`'s
// (daemon/train_checkpoint.h), told apart by their files.
LoadedModel load_model(const ModelSource& source);

// The model's tokenizer: source.tokenizer, else the config's [data].tokenizer, else the Hugging
// Face directory's tokenizer.json, else bytes. Throws Error naming both vocabularies when it does
// not fit the model (Tokenizer::fits: one larger than the model's, or smaller by more than padding;
// bytes for a model whose vocabulary is not 256, which needs --tokenizer).
std::unique_ptr<Tokenizer> load_model_tokenizer(const ModelSource& source,
                                                const LoadedModel& model);

// Writes the source's model and its tokenizer.json to `out` as a Hugging Face directory; prints
// what it wrote. Returns the exit status (2 when no node answered at the control address).
int run_export(const ModelSource& source, const std::filesystem::path& out);

// Prints the prompt and its continuation, through the model's tokenizer; returns the exit status.
int run_sample(const ModelSource& source, const std::string& prompt, const SampleOptions& options);

}  // namespace starling::cli
