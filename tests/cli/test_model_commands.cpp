// `starling export` and `starling sample` (cli/model_commands.h) on swarm checkpoints written the
// way starlingd writes them: the exported files against the checkpoint's phi and an independent
// numpy Llama (tests/support/hf_export_check.py), and the sources that must be refused.
#include <fcntl.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <vector>

#include "cli/control_client.h"
#include "cli/model_commands.h"
#include "common/atomic_file.h"
#include "common/error.h"
#include "daemon/checkpoint_dir.h"
#include "daemon/swarm/node_config.h"
#include "daemon/swarm/swarm_checkpoint.h"
#include "daemon/swarm/swarm_snapshot.h"
#include "daemon/train_checkpoint.h"
#include "data/bpe_tokenizer.h"
#include "data/bpe_trainer.h"
#include "kernels/cpu/cpu_ops.h"
#include "model/hf_format.h"
#include "model/model.h"
#include "peer/state_sync.h"
#include "tests/support/files.h"

using namespace starling;
using namespace starling::cli;
using Catch::Contains;
namespace fs = std::filesystem;

namespace {

const fs::path kPico = fs::path(STARLING_SOURCE_DIR) / "configs" / "pico.toml";

ModelConfig pico_model() {
    return load_node_config(kPico, NodeConfigUse::ReadCheckpoints).swarm.train.model;
}

// pico's initialisation scaled 15x, so that the next byte is far from uniform and a greedy choice
// is clear in float32 as in float64.
std::vector<float> peaked_phi(uint64_t seed) {
    CpuOps<float> ops;
    Model<float> model(pico_model(), ops, 1, 4);
    model.init_weights(seed);
    std::vector<float> phi(model.params(), model.params() + model.num_params());
    for (float& v : phi) v *= 15.0f;
    return phi;
}

// Saves phi as a swarm checkpoint of `round` under data_dir/checkpoints, as starlingd does.
fs::path save_checkpoint(const fs::path& data_dir, uint64_t round, const std::vector<float>& phi,
                         const std::string& fingerprint) {
    const std::vector<float> zeros(phi.size(), 0.0f);
    auto snapshot = std::make_shared<const Snapshot>(
        fingerprint, round, "test",
        pack_swarm_snapshot({round, round * 10, round * 10}, phi, zeros, zeros, zeros));
    return save_swarm_checkpoint(data_dir / "checkpoints", 10, fingerprint,
                                 {snapshot, {0, round * 100}});
}

std::string fingerprint() { return ParameterManifest(pico_model()).fingerprint(); }

// A special token's id as transformers' LlamaConfig reads config.json: the file's value, null
// included, or for a missing key its defaults (bos 1, eos 2, pad None).
nlohmann::json llama_config_token(const nlohmann::json& config, const std::string& key) {
    if (config.contains(key)) return config[key];
    if (key == "bos_token_id") return 1;
    if (key == "eos_token_id") return 2;
    return nullptr;
}

ModelSource node_source(const fs::path& data_dir) {
    ModelSource source;
    source.config_path = kPico;
    source.data_dir = data_dir;
    return source;
}

}  // namespace

TEST_CASE(
    "export writes the newest checkpoint's phi as a Hugging Face directory an independent Llama reads") {
    test::TempDir dir;
    const fs::path data_dir = dir.path() / "node";
    save_checkpoint(data_dir, 3, peaked_phi(1), fingerprint());
    const std::vector<float> phi = peaked_phi(2);
    save_checkpoint(data_dir, 5, phi, fingerprint());

    const fs::path out = dir.path() / "hf";
    REQUIRE(run_export(node_source(data_dir), out) == 0);
    const ModelConfig config = pico_model();
    nlohmann::json written = nlohmann::json::parse(test::slurp(out / "config.json"));
    // Bytes have no special token: as LlamaConfig reads the file, none begins or ends a text
    // (a missing key would make them 1 and 2, two ordinary bytes).
    CHECK(llama_config_token(written, "bos_token_id").is_null());
    CHECK(llama_config_token(written, "eos_token_id").is_null());
    CHECK(llama_config_token(written, "pad_token_id").is_null());
    for (const char* key : {"bos_token_id", "eos_token_id", "pad_token_id"}) written.erase(key);
    CHECK(written == llama_config_json(config));
    const HfModel exported = read_hf_model_dir(out);
    REQUIRE(exported.params.size() == phi.size());
    CHECK(std::memcmp(exported.params.data(), phi.data(), phi.size() * sizeof(float)) == 0);
    CHECK(nlohmann::json::parse(test::slurp(out / "tokenizer_config.json"))["model_max_length"] ==
          config.context);

    // Sampled from the checkpoint, past the context so the window slides: the reference agrees.
    const std::string prompt = "In the beginning God created";
    SampleOptions greedy;
    greedy.temperature = 0.0f;
    greedy.tokens = 2 * config.context;
    CpuOps<float> ops;
    Model<float> model(config, ops, 1, config.context);
    const LoadedModel loaded = load_model(node_source(data_dir));
    CHECK(loaded.origin.find("round 5 of") == 0);
    ops.from_host(model.params(), loaded.params.data(), loaded.params.size());
    const std::vector<int32_t> tokens(prompt.begin(), prompt.end());
    const std::vector<int32_t> continuation = continue_tokens(model, tokens, greedy);
    write_file_atomic(out / "sample.json",
                      nlohmann::json{{"prompt", tokens}, {"continuation", continuation}}.dump());
    const std::string command = std::string("/usr/bin/python3 ") + STARLING_SOURCE_DIR +
                                "/tests/support/hf_export_check.py '" + out.string() + "'";
    CHECK(std::system(command.c_str()) == 0);
}

TEST_CASE(
    "export skips a corrupt newest checkpoint and leaves it in place, and refuses bad sources") {
    test::TempDir dir;
    const fs::path data_dir = dir.path() / "node";
    ModelSource source = node_source(data_dir);
    CHECK_THROWS_WITH(load_model(source),
                      Contains("no checkpoint under " + (data_dir / "checkpoints").string()));

    save_checkpoint(data_dir, 3, peaked_phi(1), fingerprint());
    const fs::path newest = save_checkpoint(data_dir, 5, peaked_phi(2), fingerprint());
    std::string state = test::slurp(newest / "state.bin");
    state[100] ^= 1;
    test::put(newest / "state.bin", state);
    const LoadedModel loaded = load_model(source);
    CHECK(loaded.origin.find("round 3 of") == 0);
    CHECK(loaded.params == peaked_phi(1));
    CHECK(fs::exists(newest / "state.bin"));  // read-only: a running node's directory is its own

    source.checkpoint = newest;
    CHECK_THROWS_WITH(load_model(source), Contains("state.bin"));

    ModelSource both = node_source(data_dir);
    both.hf_dir = dir.path();
    CHECK_THROWS_WITH(load_model(both), Contains("not both"));
    ModelSource only_checkpoint;
    only_checkpoint.checkpoint = newest;
    CHECK_THROWS_WITH(load_model(only_checkpoint), Contains("need the node's --config"));

    // Neither: the live node at the control address, and here none answers.
    ModelSource live;
    live.control = "127.0.0.1:1";
    try {
        load_model(live);
        FAIL("no node answers at " + live.control);
    } catch (const ControlCallFailed& e) {
        CHECK(e.exit_code == kExitUnreachable);
        CHECK_THAT(e.what(), Contains("cannot reach starlingd at 127.0.0.1:1"));
    }

    const fs::path other = dir.path() / "other";
    save_checkpoint(other, 4, peaked_phi(1), "another model's fingerprint");
    CHECK_THROWS_WITH(load_model(node_source(other)), Contains("saved for model"));
}

namespace {

// What f prints on stdout.
std::string captured_stdout(const std::function<void()>& f) {
    test::TempDir dir;
    const fs::path file = dir.path() / "stdout";
    std::fflush(stdout);
    const int saved = ::dup(1);
    const int fd = ::open(file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    ::dup2(fd, 1);
    ::close(fd);
    f();
    std::fflush(stdout);
    ::dup2(saved, 1);
    ::close(saved);
    return test::slurp(file);
}

}  // namespace

TEST_CASE(
    "a BPE config's tokenizer.json is exported with the model, and sample speaks through it") {
    test::TempDir dir;
    const std::string verse = "In the beginning God created the heaven and the earth. ";
    std::string corpus;
    for (int i = 0; i < 10; i++) corpus += verse;
    const TrainedBpe trained = train_bpe(corpus, 300);
    REQUIRE(trained.token_bytes.size() < 300);  // the corpus runs out of pairs first
    const fs::path tokenizer_path = dir.path() / "kjv-tokenizer.json";
    test::put(tokenizer_path, trained.hf_json);

    // pico with its embedding padded to 320 rows and [data].tokenizer set.
    std::string toml = test::slurp(kPico);
    const auto replace = [&](const std::string& from, const std::string& to) {
        const size_t at = toml.find(from);
        REQUIRE(at != std::string::npos);
        toml.replace(at, from.size(), to);
    };
    replace("vocab_size = 256", "vocab_size = 320");
    replace("[data]\n", "[data]\ntokenizer = \"" + tokenizer_path.string() + "\"\n");
    const fs::path config_path = dir.path() / "pico-bpe.toml";
    test::put(config_path, toml);
    const ModelConfig config =
        load_node_config(config_path, NodeConfigUse::ReadCheckpoints).swarm.train.model;
    REQUIRE(config.vocab_size == 320);
    CpuOps<float> init_ops;
    Model<float> init(config, init_ops, 1, 4);
    init.init_weights(4);
    std::vector<float> phi(init.params(), init.params() + init.num_params());
    for (float& v : phi) v *= 15.0f;
    const fs::path data_dir = dir.path() / "node";
    save_checkpoint(data_dir, 2, phi, ParameterManifest(config).fingerprint());
    ModelSource source;
    source.config_path = config_path;
    source.data_dir = data_dir;

    const fs::path out = dir.path() / "hf";
    REQUIRE(run_export(source, out) == 0);
    CHECK(test::slurp(out / "tokenizer.json") == trained.hf_json);
    // generate() begins and stops on <|endoftext|>, the tokenizer's last id, as LlamaConfig reads
    // config.json, and AutoTokenizer names it from tokenizer_config.json.
    const std::vector<uint16_t> end_of_text =
        BpeTokenizer::parse(trained.hf_json, "trained").encode("<|endoftext|>");
    REQUIRE(end_of_text.size() == 1);
    CHECK(end_of_text[0] == trained.token_bytes.size() - 1);
    const nlohmann::json exported_config = nlohmann::json::parse(test::slurp(out / "config.json"));
    CHECK(llama_config_token(exported_config, "eos_token_id") == end_of_text[0]);
    CHECK(llama_config_token(exported_config, "bos_token_id") == end_of_text[0]);
    CHECK(llama_config_token(exported_config, "pad_token_id").is_null());
    const nlohmann::json tokenizer_config =
        nlohmann::json::parse(test::slurp(out / "tokenizer_config.json"));
    CHECK(tokenizer_config["eos_token"] == "<|endoftext|>");
    CHECK(tokenizer_config["bos_token"] == "<|endoftext|>");

    // The prompt through the trained tokenizer ("In" " the" " beginning" are whole tokens of a
    // corpus made of them), the greedy continuation decoded by it.
    const BpeTokenizer tokenizer = BpeTokenizer::parse(trained.hf_json, "trained");
    const std::string prompt = "In the beginning";
    const std::vector<uint16_t> encoded = tokenizer.encode(prompt);
    CHECK(encoded.size() == 3);
    SampleOptions greedy;
    greedy.temperature = 0.0f;
    greedy.tokens = 20;
    greedy.vocab = tokenizer.vocab_size();
    CpuOps<float> ops;
    Model<float> model(config, ops, 1, config.context);
    ops.from_host(model.params(), phi.data(), phi.size());
    const std::vector<int32_t> continuation =
        continue_tokens(model, std::vector<int32_t>(encoded.begin(), encoded.end()), greedy);
    const std::string expected =
        prompt + tokenizer.decode(std::vector<uint16_t>(continuation.begin(), continuation.end())) +
        "\n";
    greedy.vocab = 0;  // sample sets it from the tokenizer
    CHECK(captured_stdout([&] { REQUIRE(run_sample(source, prompt, greedy) == 0); }) == expected);

    // The exported directory carries its tokenizer; without it the vocabulary is not the byte one.
    ModelSource exported;
    exported.hf_dir = out;
    const LoadedModel loaded = load_model(exported);
    CHECK(load_model_tokenizer(exported, loaded)->path() == (out / "tokenizer.json").string());
    fs::remove(out / "tokenizer.json");
    CHECK_THROWS_WITH(load_model_tokenizer(exported, loaded),
                      Contains("has a vocabulary of 320 tokens, not the byte vocabulary's 256") &&
                          Contains("--tokenizer FILE"));
    exported.tokenizer = tokenizer_path;
    CHECK(load_model_tokenizer(exported, loaded)->vocab_size() == tokenizer.vocab_size());
    // A tokenizer.json of 256 tokens is not this 320-row model's: more rows than padding adds.
    const fs::path bytes_file = dir.path() / "bytes-tokenizer.json";
    test::put(bytes_file, ByteTokenizer().hf_json());
    exported.tokenizer = bytes_file;
    CHECK_THROWS_WITH(load_model_tokenizer(exported, loaded),
                      Contains("(256 tokens") && Contains("does not fit") &&
                          Contains("320 tokens") && Contains("--tokenizer FILE"));
    CHECK_THROWS_WITH(run_export(exported, dir.path() / "refused"), Contains("does not fit"));
    CHECK_FALSE(fs::exists(dir.path() / "refused"));
    exported.tokenizer = fs::path(STARLING_SOURCE_DIR) / "tests/data/gpt2_style_tokenizer.json";
    CHECK_THROWS_WITH(load_model_tokenizer(exported, loaded), Contains("50257 tokens") &&
                                                                  Contains("does not fit") &&
                                                                  Contains("320 tokens"));

    // A live node sends its tokenizer.json with the weights (GetModel): no file needed here.
    LoadedModel live = loaded;
    live.tokenizer_json = trained.hf_json;
    const std::unique_ptr<Tokenizer> sent = load_model_tokenizer(ModelSource{}, live);
    CHECK(sent->hf_json() == trained.hf_json);
    CHECK(sent->encode(prompt) == encoded);
    live.tokenizer_json = ByteTokenizer().hf_json();
    live.config.vocab_size = 256;
    CHECK(load_model_tokenizer(ModelSource{}, live)->describe() == ByteTokenizer().describe());
}

TEST_CASE(
    "export and sample read `starling train` checkpoints too: the newest of [checkpoint].dir, or "
    "the one named") {
    test::TempDir dir;
    // pico with its run directory here, where `starling train --config` writes its checkpoints.
    std::string toml = test::slurp(kPico);
    const std::string run_key = "dir = \"out/runs/pico\"";
    REQUIRE(toml.find(run_key) != std::string::npos);
    const fs::path run_dir = dir.path() / "runs";
    toml.replace(toml.find(run_key), run_key.size(), "dir = \"" + run_dir.string() + "\"");
    const fs::path config_path = dir.path() / "pico.toml";
    test::put(config_path, toml);

    // Written as the trainer writes them: atomically, model and training state.
    const auto save_step = [](const fs::path& root, const ModelConfig& model, int64_t step,
                              const std::vector<float>& params) {
        const TrainingArenas arenas{params, std::vector<float>(params.size()),
                                    std::vector<float>(params.size())};
        TrainingState state;
        state.step = state.adamw_steps = step;
        return CheckpointDir(root, 0).save(uint64_t(step), [&](const fs::path& staging) {
            write_training_checkpoint(staging, model, ParameterManifest(model), arenas, state,
                                      ByteTokenizer().hf_json());
        });
    };
    const fs::path step_10 = save_step(run_dir, pico_model(), 10, peaked_phi(1));
    save_step(run_dir, pico_model(), 20, peaked_phi(2));

    ModelSource source;
    source.config_path = config_path;
    source.data_dir = dir.path() / "node";  // no node checkpoint there
    LoadedModel loaded = load_model(source);
    CHECK(loaded.origin == "step 20 of " + (run_dir / "step_00000020").string());
    CHECK(loaded.params == peaked_phi(2));

    source.checkpoint = step_10;
    loaded = load_model(source);
    CHECK(loaded.origin == "step 10 of " + step_10.string());
    CHECK(loaded.params == peaked_phi(1));
    const fs::path out = dir.path() / "hf";
    REQUIRE(run_export(source, out) == 0);
    CHECK(read_hf_model_dir(out).params == peaked_phi(1));
    SampleOptions greedy;
    greedy.temperature = 0.0f;
    greedy.tokens = 4;
    CHECK(captured_stdout([&] {
              REQUIRE(run_sample(source, "In the", greedy) == 0);
          }).starts_with("In the"));

    // A node's checkpoint comes before the trainer's; one of another model is refused by name.
    source.checkpoint.reset();
    save_checkpoint(dir.path() / "node", 3, peaked_phi(3), fingerprint());
    CHECK(load_model(source).origin.find("round 3 of") == 0);
    ModelConfig other = pico_model();
    other.n_layer += 1;
    CpuOps<float> ops;
    Model<float> other_model(other, ops, 1, 4);
    other_model.init_weights(1);
    source.checkpoint = save_step(
        dir.path() / "other-runs", other, 5,
        std::vector<float>(other_model.params(), other_model.params() + other_model.num_params()));
    CHECK_THROWS_WITH(load_model(source),
                      Contains("step_00000005/config.json: saved for model") &&
                          Contains("but the config's model is " + fingerprint()));

    // A node directory shared with another model's node (pico and nano share out/node): its
    // checkpoints are skipped, and the trainer's of this model found.
    source.checkpoint.reset();
    source.data_dir = dir.path() / "other-node";
    save_checkpoint(*source.data_dir, 7, peaked_phi(3), "another model's fingerprint");
    CHECK(load_model(source).origin == "step 20 of " + (run_dir / "step_00000020").string());

    // Neither kind: the message names both places and the keys that make checkpoints.
    source.checkpoint.reset();
    source.data_dir = dir.path() / "empty-node";
    fs::remove_all(run_dir);
    CHECK_THROWS_WITH(
        load_model(source),
        Contains("no checkpoint under " + (dir.path() / "empty-node" / "checkpoints").string() +
                 " or " + run_dir.string()) &&
            Contains("[swarm].checkpoint_every") && Contains("[checkpoint].every"));
}
