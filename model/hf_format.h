// The model on disk in Hugging Face form: model.safetensors with Llama tensor names (fp32) and a
// config.json in LlamaConfig form, so the files load with LlamaForCausalLM without conversion,
// and the tokenizer.json of its vocabulary, so AutoTokenizer loads it too. Our RoPE uses Hugging
// Face's rotate-half pairing, so q_proj and k_proj need no permutation.
#pragma once

#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "model/config.h"
#include "model/manifest.h"

namespace starling {

nlohmann::json llama_config_json(const ModelConfig& config);
// The inverse of llama_config_json; throws starling::Error naming source and the field for a
// config that is not a Llama model this engine can run (biases, grouped KV heads, scaled RoPE...).
ModelConfig model_config_from_llama_json(const nlohmann::json& json, const std::string& source);
// Reads a config.json; throws starling::Error naming the file for unreadable or invalid JSON too.
ModelConfig read_llama_config(const std::filesystem::path& path);

// params: the flat arena in manifest order, on the host.
void write_model_safetensors(const std::filesystem::path& path, const ParameterManifest& manifest,
                             const float* params);
// Fills params from the file, checking that every tensor of the manifest is present with the
// right dtype and shape and that the fingerprint matches when the file records one.
void read_model_safetensors(const std::filesystem::path& path, const ParameterManifest& manifest,
                            float* params);

// A directory that from_pretrained loads: model.safetensors, config.json and, given the model's
// tokenizer.json (data/tokenizer.h makes it), that file and tokenizer_config.json; each file
// written atomically.
void write_hf_model_dir(const std::filesystem::path& dir, const ModelConfig& config,
                        const ParameterManifest& manifest, const float* params,
                        const std::optional<std::string>& tokenizer_json);

struct HfModel {
    ModelConfig config;
    std::vector<float> params;  // manifest order
};
// Reads config.json and model.safetensors from such a directory.
HfModel read_hf_model_dir(const std::filesystem::path& dir);

}  // namespace starling
