// The saved model against a second implementation: tests/support/llama_reference.py, a numpy
// Llama forward written from Hugging Face's LlamaForCausalLM, loads model.safetensors and
// config.json as a Hugging Face loader would and must reproduce the engine's per-position losses.
#include <catch2/catch.hpp>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <vector>

#include "common/atomic_file.h"
#include "kernels/cpu/cpu_ops.h"
#include "model/hf_format.h"
#include "model/model.h"
#include "tests/support/files.h"

using namespace starling;

TEST_CASE("a checkpoint computes the same losses in an independent Hugging Face-style Llama") {
    const bool tied = GENERATE(true, false);
    CAPTURE(tied);
    ModelConfig config;
    config.n_layer = 2;
    config.n_head = 2;
    config.d_model = 16;
    config.d_ff = 24;
    config.vocab_size = 32;
    config.context = 12;
    config.tied_embeddings = tied;
    config.rope_theta = 1000.0f;  // not the default, so config.json must carry it
    config.norm_eps = 1e-6f;
    config.init_std = 0.3f;  // large enough that attention is far from uniform
    const int B = 2, T = 12;

    CpuOps<float> ops;
    Model<float> model(config, ops, B, T);
    model.init_weights(11);
    nlohmann::json rows = nlohmann::json::array();
    std::vector<int32_t> inputs, targets;
    for (int b = 0; b < B; b++) {
        std::vector<int32_t> row;
        for (int t = 0; t <= T; t++) row.push_back((t * t * 5 + b * 13 + t) % config.vocab_size);
        inputs.insert(inputs.end(), row.begin(), row.end() - 1);
        targets.insert(targets.end(), row.begin() + 1, row.end());
        rows.push_back(row);
    }
    model.forward(inputs.data(), targets.data());
    const std::vector<double> losses = model.position_losses();
    nlohmann::json loss_rows = nlohmann::json::array();
    for (int b = 0; b < B; b++) {
        loss_rows.push_back(
            std::vector<double>(losses.begin() + b * T, losses.begin() + (b + 1) * T));
    }

    test::TempDir dir;
    write_model_safetensors(dir.path() / "model.safetensors", model.manifest(), model.params());
    write_file_atomic(dir.path() / "config.json", llama_config_json(config).dump(2));
    write_file_atomic(dir.path() / "case.json",
                      nlohmann::json{{"tokens", rows}, {"losses", loss_rows}}.dump());

    const std::string command = std::string("/usr/bin/python3 ") + STARLING_SOURCE_DIR +
                                "/tests/support/llama_reference.py '" + dir.path().string() + "'";
    CHECK(std::system(command.c_str()) == 0);
}
