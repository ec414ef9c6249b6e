#include "model/hf_format.h"

#include <span>

#include "common/atomic_file.h"
#include "common/error.h"
#include "model/safetensors.h"

namespace starling {

namespace {

constexpr const char* kFingerprintKey = "starling.fingerprint";

// The one special token of the tokenizers data/ writes (the BPE trainer's last id; GPT-2's files
// have it too). Spelt here since the model's layer does not see data/.
constexpr const char* kEndOfText = "<|endoftext|>";

// The id of <|endoftext|> among the tokenizer.json's added tokens; null where it has none (the
// byte tokenizer) or no tokenizer is given.
nlohmann::json end_of_text_id(const std::optional<std::string>& tokenizer_json) {
    if (!tokenizer_json) return nullptr;
    const nlohmann::json tokenizer = nlohmann::json::parse(*tokenizer_json, nullptr, false);
    if (!tokenizer.is_object() || !tokenizer.contains("added_tokens") ||
        !tokenizer["added_tokens"].is_array())
        return nullptr;
    for (const nlohmann::json& token : tokenizer["added_tokens"])
        if (token.is_object() && token.value("content", "") == kEndOfText && token.contains("id") &&
            token["id"].is_number_integer())
            return token["id"];
    return nullptr;
}

}  // namespace

nlohmann::json llama_config_json(const ModelConfig& c) {
    return {
        {"architectures", {"LlamaForCausalLM"}},
        {"model_type", "llama"},
        {"hidden_size", c.d_model},
        {"intermediate_size", c.d_ff},
        {"num_hidden_layers", c.n_layer},
        {"num_attention_heads", c.n_head},
        {"num_key_value_heads", c.n_head},
        {"head_dim", c.head_size()},
        {"vocab_size", c.vocab_size},
        {"max_position_embeddings", c.context},
        {"rms_norm_eps", c.norm_eps},
        {"rope_theta", c.rope_theta},
        {"rope_scaling", nullptr},
        {"tie_word_embeddings", c.tied_embeddings},
        {"hidden_act", "silu"},
        {"attention_bias", false},
        {"mlp_bias", false},
        {"attention_dropout", 0.0},
        {"initializer_range", c.init_std},
        {"torch_dtype", "float32"},
    };
}

ModelConfig model_config_from_llama_json(const nlohmann::json& j, const std::string& source) {
    auto fail = [&](const std::string& problem) -> void { throw Error(source + ": " + problem); };
    if (!j.is_object()) fail("not a JSON object");
    auto number = [&](const char* key) -> const nlohmann::json& {
        if (!j.contains(key) || !j[key].is_number()) fail(std::string("missing number ") + key);
        return j[key];
    };
    if (j.value("model_type", "") != "llama") fail("model_type is not \"llama\"");
    ModelConfig c;
    c.d_model = number("hidden_size").get<int>();
    c.d_ff = number("intermediate_size").get<int>();
    c.n_layer = number("num_hidden_layers").get<int>();
    c.n_head = number("num_attention_heads").get<int>();
    c.vocab_size = number("vocab_size").get<int>();
    c.context = number("max_position_embeddings").get<int>();
    c.norm_eps = number("rms_norm_eps").get<float>();
    c.rope_theta = j.contains("rope_theta") ? number("rope_theta").get<float>() : 10000.0f;
    c.tied_embeddings = j.value("tie_word_embeddings", false);
    c.init_std = j.contains("initializer_range") ? number("initializer_range").get<float>() : 0.02f;
    if (j.contains("num_key_value_heads") && number("num_key_value_heads").get<int>() != c.n_head) {
        fail(
            "grouped key/value heads (num_key_value_heads != num_attention_heads) are not supported");
    }
    if (j.value("attention_bias", false) || j.value("mlp_bias", false))
        fail("biases are not supported");
    if (j.contains("rope_scaling") && !j["rope_scaling"].is_null())
        fail("rope_scaling is not supported");
    if (j.value("hidden_act", "silu") != "silu") fail("hidden_act must be silu");
    try {
        c.validate();
    } catch (const Error& e) {
        fail(e.what());
    }
    return c;
}

ModelConfig read_llama_config(const std::filesystem::path& path) {
    nlohmann::json json;
    try {
        json = nlohmann::json::parse(read_file(path));
    } catch (const nlohmann::json::exception& e) {
        throw Error(path.string() + ": not valid JSON: " + e.what());
    }
    return model_config_from_llama_json(json, path.string());
}

void write_model_safetensors(const std::filesystem::path& path, const ParameterManifest& manifest,
                             const float* params) {
    std::vector<TensorRef> refs;
    for (const TensorInfo& t : manifest.tensors()) {
        refs.push_back({t.name, DType::F32, t.shape, params + t.offset});
    }
    write_safetensors(path, refs, {{"format", "pt"}, {kFingerprintKey, manifest.fingerprint()}});
}

void read_model_safetensors(const std::filesystem::path& path, const ParameterManifest& manifest,
                            float* params) {
    const SafetensorsFile file = SafetensorsFile::open(path);
    const auto it = file.metadata().find(kFingerprintKey);
    if (it != file.metadata().end() && it->second != manifest.fingerprint()) {
        throw Error(path.string() + ": written for a different model (fingerprint " + it->second +
                    ", this config has " + manifest.fingerprint() +
                    "): the config does not match the checkpoint");
    }
    for (const TensorInfo& t : manifest.tensors()) {
        file.read_f32(t.name, std::span<float>(params + t.offset, t.numel), t.shape);
    }
}

void write_hf_model_dir(const std::filesystem::path& dir, const ModelConfig& config,
                        const ParameterManifest& manifest, const float* params,
                        const std::optional<std::string>& tokenizer_json) {
    std::filesystem::create_directories(dir);
    write_model_safetensors(dir / "model.safetensors", manifest, params);
    // Written even when null: LlamaConfig takes bos 1 and eos 2 for a missing key, ordinary tokens
    // here (2 is '#' in the KJV's BPE), on which generate() would stop. <|endoftext|> begins and
    // ends a text, as in GPT-2; without it (bytes) no id does. No vocabulary here has a padding
    // token: the embedding's padding rows are not tokens.
    const nlohmann::json end_of_text = end_of_text_id(tokenizer_json);
    nlohmann::json config_json = llama_config_json(config);
    config_json["bos_token_id"] = end_of_text;
    config_json["eos_token_id"] = end_of_text;
    config_json["pad_token_id"] = nullptr;
    write_file_atomic(dir / "config.json", config_json.dump(2) + "\n");
    if (!tokenizer_json) return;
    write_file_atomic(dir / "tokenizer.json", *tokenizer_json);
    const nlohmann::json token = end_of_text.is_null() ? nlohmann::json() : kEndOfText;
    const nlohmann::json tokenizer_config = {{"tokenizer_class", "PreTrainedTokenizerFast"},
                                             {"model_max_length", config.context},
                                             {"clean_up_tokenization_spaces", false},
                                             {"bos_token", token},
                                             {"eos_token", token}};
    write_file_atomic(dir / "tokenizer_config.json", tokenizer_config.dump(2) + "\n");
}

HfModel read_hf_model_dir(const std::filesystem::path& dir) {
    HfModel model;
    model.config = read_llama_config(dir / "config.json");
    const ParameterManifest manifest(model.config);
    model.params.resize(manifest.total());
    read_model_safetensors(dir / "model.safetensors", manifest, model.params.data());
    return model;
}

}  // namespace starling
