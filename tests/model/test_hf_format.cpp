#include <catch2/catch.hpp>
#include <filesystem>
#include <cstring>
#include <vector>

#include "common/error.h"
#include "model/hf_format.h"
#include "model/safetensors.h"
#include "tests/support/model_configs.h"
#include "tests/support/files.h"

using namespace starling;
using namespace starling::test;
namespace fs = std::filesystem;

TEST_CASE("config.json is a LlamaConfig that reads back to the same model") {
    const ModelConfig c = tiny_model_config();
    const nlohmann::json j = llama_config_json(c);
    CHECK(j["model_type"] == "llama");
    CHECK(j["architectures"][0] == "LlamaForCausalLM");
    CHECK(j["hidden_size"] == 8);
    CHECK(j["intermediate_size"] == 12);
    CHECK(j["num_key_value_heads"] == 2);
    CHECK(j["tie_word_embeddings"] == true);
    const ModelConfig back = model_config_from_llama_json(j, "test");
    CHECK(ParameterManifest(back).fingerprint() == ParameterManifest(c).fingerprint());
}

TEST_CASE("unsupported Llama variants are refused by name") {
    nlohmann::json j = llama_config_json(tiny_model_config());
    j["num_key_value_heads"] = 1;
    CHECK_THROWS_WITH(model_config_from_llama_json(j, "cfg.json"),
                      Catch::Contains("cfg.json") && Catch::Contains("grouped"));
    j = llama_config_json(tiny_model_config());
    j["attention_bias"] = true;
    CHECK_THROWS_WITH(model_config_from_llama_json(j, "cfg.json"), Catch::Contains("biases"));
    j = llama_config_json(tiny_model_config());
    j.erase("hidden_size");
    CHECK_THROWS_WITH(model_config_from_llama_json(j, "cfg.json"), Catch::Contains("hidden_size"));
}

TEST_CASE("model.safetensors holds every tensor under its Hugging Face name") {
    TempDir dir;
    const ParameterManifest m(tiny_model_config());
    std::vector<float> params(m.total());
    for (size_t i = 0; i < params.size(); i++) params[i] = 0.001f * float(i);
    const fs::path path = dir.path() / "model.safetensors";
    write_model_safetensors(path, m, params.data());

    const SafetensorsFile file = SafetensorsFile::open(path);
    CHECK(file.names().size() == m.tensors().size());
    const TensorInfo& k = m.find("model.layers.1.self_attn.k_proj.weight");
    const TensorEntry& e = file.get(k.name);
    CHECK(e.dtype == DType::F32);
    CHECK(e.shape == k.shape);
    float first;
    std::memcpy(&first, e.bytes.data(), sizeof first);
    CHECK(first == params[k.offset]);

    std::vector<float> back(m.total());
    read_model_safetensors(path, m, back.data());
    CHECK(back == params);
}

TEST_CASE("reading weights into a different model fails naming the file") {
    TempDir dir;
    const ParameterManifest m(tiny_model_config());
    std::vector<float> params(m.total(), 0.5f);
    const fs::path path = dir.path() / "model.safetensors";
    write_model_safetensors(path, m, params.data());
    ModelConfig other = tiny_model_config();
    other.n_layer = 3;
    const ParameterManifest m3(other);
    std::vector<float> back(m3.total());
    CHECK_THROWS_WITH(read_model_safetensors(path, m3, back.data()),
                      Catch::Contains(path.string()) && Catch::Contains("different model"));
}
