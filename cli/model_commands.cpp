#include "cli/model_commands.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "cli/control_client.h"
#include "common/error.h"
#include "daemon/checkpoint_dir.h"
#include "daemon/config.h"
#include "daemon/swarm/node_config.h"
#include "daemon/swarm/swarm_checkpoint.h"
#include "daemon/swarm/swarm_snapshot.h"
#include "data/bpe_tokenizer.h"
#include "kernels/cpu/cpu_ops.h"
#include "model/hf_format.h"
#include "model/manifest.h"

namespace starling::cli {

namespace {

// step_* directories under root, newest first. Listed here rather than through CheckpointDir,
// whose constructor tidies leftovers: a running daemon's checkpoint in the making among them.
std::vector<std::filesystem::path> checkpoints_newest_first(const std::filesystem::path& root) {
    std::vector<std::pair<uint64_t, std::filesystem::path>> found;
    if (!std::filesystem::exists(root)) return {};
    std::error_code error;
    for (const auto& entry : std::filesystem::directory_iterator(root, error)) {
        const auto step = CheckpointDir::parse_step_dir_name(entry.path().filename().string());
        if (step && entry.is_directory()) found.emplace_back(*step, entry.path());
    }
    if (error)
        throw Error("cannot list the checkpoints in " + root.string() + ": " + error.message());
    std::sort(found.begin(), found.end(),
              [](const auto& a, const auto& b) { return a.first > b.first; });
    std::vector<std::filesystem::path> paths;
    for (auto& [step, path] : found) paths.push_back(std::move(path));
    return paths;
}

// The step or round a checkpoint directory's name says, for messages: "step 300 of DIR".
std::string checkpoint_origin(const char* unit, const std::filesystem::path& dir) {
    const auto step = CheckpointDir::parse_step_dir_name(dir.filename().string());
    return step ? std::string(unit) + " " + std::to_string(*step) + " of " + dir.string()
                : dir.string();
}

// One checkpoint directory of either kind: a swarm node's (checkpoint.json and state.bin,
// daemon/swarm/swarm_checkpoint.h) or `starling train`'s (the model in Hugging Face form beside
// training_state.safetensors, daemon/train_checkpoint.h). Either must hold `model`: one of
// another throws an Error naming its file.
LoadedModel read_checkpoint(const std::filesystem::path& dir, const ModelConfig& model) {
    const ParameterManifest manifest(model);
    const bool swarm = std::filesystem::exists(dir / "checkpoint.json");
    if (!swarm && !std::filesystem::exists(dir / "model.safetensors"))
        throw Error(dir.string() +
                    " holds no checkpoint: neither a node's (checkpoint.json) nor `starling "
                    "train`'s (model.safetensors)");
    if (!swarm) {
        HfModel hf = read_hf_model_dir(dir);
        const std::string theirs = ParameterManifest(hf.config).fingerprint();
        if (theirs != manifest.fingerprint())
            throw Error((dir / "config.json").string() + ": saved for model " + theirs +
                        ", but the config's model is " + manifest.fingerprint());
        return {hf.config, std::move(hf.params), checkpoint_origin("step", dir), ""};
    }
    const SwarmCheckpoint checkpoint = read_swarm_checkpoint(dir, manifest.fingerprint());
    const size_t n = manifest.total();
    std::vector<float> arenas(4 * n);
    const std::span<float> all(arenas);
    unpack_swarm_snapshot(checkpoint.state, {all.subspan(0, n), all.subspan(n, n),
                                             all.subspan(2 * n, n), all.subspan(3 * n, n)});
    arenas.resize(n);  // phi, the model the swarm agrees on; theta equals it at a round's start
    return {model, std::move(arenas),
            "round " + std::to_string(checkpoint.round) + " of " + checkpoint.path.string(), ""};
}

// The newest checkpoint of `model` that reads back whole: the node's (starlingd's, under
// [node].data_dir), else `starling train`'s (under [checkpoint].dir), each newest first. Others
// are skipped with a warning: a corrupt one, and one of another model (configs may share a
// data directory); nothing is written, so none is lost.
LoadedModel newest_readable(const std::filesystem::path& node_root,
                            const std::filesystem::path& train_root, const ModelConfig& model) {
    std::vector<std::filesystem::path> dirs = checkpoints_newest_first(node_root);
    for (std::filesystem::path& dir : checkpoints_newest_first(train_root))
        dirs.push_back(std::move(dir));
    std::string skipped;
    for (const std::filesystem::path& dir : dirs) {
        try {
            return read_checkpoint(dir, model);
        } catch (const Error& e) {
            spdlog::warn("skipping {}: {}", dir.string(), e.what());
            skipped += std::string(skipped.empty() ? "" : "; ") + e.what();
        }
    }
    throw Error("no checkpoint under " + node_root.string() + " or " + train_root.string() +
                " reads back whole" +
                (skipped.empty() ? " (there is none: starlingd writes one every "
                                   "[swarm].checkpoint_every rounds and when it leaves, `starling "
                                   "train` every [checkpoint].every steps and at its end)"
                                 : ": " + skipped));
}

LoadedModel load_checkpoint(const ModelSource& source) {
    NodeConfig config = load_node_config(*source.config_path, NodeConfigUse::ReadCheckpoints);
    if (source.data_dir) config.data_dir = *source.data_dir;
    const ModelConfig& model = config.swarm.train.model;
    if (source.checkpoint) return read_checkpoint(*source.checkpoint, model);
    // [checkpoint].dir is `starling train`'s key, which the node's config leaves aside.
    const std::string run_dir = load_train_config(source.config_path->string()).run_dir;
    return newest_readable(config.checkpoint_dir(), run_dir, model);
}

LoadedModel load_live_model(const std::string& address) {
    ControlClient client(address);
    std::optional<ModelConfig> config;
    uint64_t round = 0, parameters = 0;
    std::string tokenizer_json;
    std::vector<float> phi;
    size_t filled = 0;  // bytes of phi received
    std::string problem;
    const grpc::Status status = client.get_model([&](const v1::ModelChunk& chunk) {
        if (!problem.empty()) return;
        if (!config) {
            try {
                config = model_config_from_llama_json(
                    nlohmann::json::parse(chunk.llama_config_json()), "the node's model config");
            } catch (const std::exception& e) {
                problem = e.what();
                return;
            }
            round = chunk.round();
            parameters = chunk.parameters();
            tokenizer_json = chunk.tokenizer_json();
            if (parameters != ParameterManifest(*config).total()) {
                problem = "the node sent " + std::to_string(parameters) +
                          " weights for a model of " +
                          std::to_string(ParameterManifest(*config).total());
                return;
            }
            phi.resize(parameters);
        }
        if (chunk.phi().size() > phi.size() * sizeof(float) - filled) {
            problem = "the node sent more weights than its model has";
            return;
        }
        std::memcpy(reinterpret_cast<char*>(phi.data()) + filled, chunk.phi().data(),
                    chunk.phi().size());
        filled += chunk.phi().size();
    });
    if (!status.ok())
        throw ControlCallFailed(exit_code_for(status, false),
                                failure_message(status, false, address));
    if (!problem.empty()) throw Error("the model from the node at " + address + ": " + problem);
    if (!config || filled != phi.size() * sizeof(float))
        throw Error("the model from the node at " + address + " ended early");
    return {*config, std::move(phi),
            "round " + std::to_string(round) + " of the node at " + address,
            std::move(tokenizer_json)};
}

// Errors of the live node carry their own exit status; everything else is bad input (1).
int with_exit_status(const std::function<int()>& command) {
    try {
        return command();
    } catch (const ControlCallFailed& e) {
        std::fprintf(stderr, "%s\n", e.what());  // "error: ...", as every Control command prints it
        return e.exit_code;
    }
}

}  // namespace

LoadedModel load_model(const ModelSource& source) {
    if (source.hf_dir && (source.config_path || source.checkpoint || source.data_dir))
        throw Error(
            "give either --model (a Hugging Face directory) or --config with its checkpoint, not both");
    if (source.hf_dir) {
        HfModel hf = read_hf_model_dir(*source.hf_dir);
        return {hf.config, std::move(hf.params), source.hf_dir->string(), ""};
    }
    if (source.config_path) return load_checkpoint(source);
    if (source.checkpoint || source.data_dir)
        throw Error("--checkpoint and --data-dir need the node's --config");
    return load_live_model(source.control);
}

std::unique_ptr<Tokenizer> load_model_tokenizer(const ModelSource& source,
                                                const LoadedModel& model) {
    std::string path;
    if (source.tokenizer) {
        path = source.tokenizer->string();
    } else if (source.config_path) {
        path = load_node_config(*source.config_path, NodeConfigUse::ReadCheckpoints)
                   .swarm.train.data.tokenizer;
    } else if (source.hf_dir && std::filesystem::exists(*source.hf_dir / "tokenizer.json")) {
        path = (*source.hf_dir / "tokenizer.json").string();
    }
    // A live node sends the tokenizer.json it trains with (the byte one is a BPE without merges).
    std::unique_ptr<Tokenizer> tokenizer =
        path.empty() && !model.tokenizer_json.empty() &&
                model.tokenizer_json != ByteTokenizer().hf_json()
            ? std::make_unique<BpeTokenizer>(
                  BpeTokenizer::parse(model.tokenizer_json, "the tokenizer of " + model.origin))
            : load_tokenizer(path);
    const int vocab = model.config.vocab_size;
    if (path.empty() && !tokenizer->fits(vocab))
        throw Error(
            model.origin + " has a vocabulary of " + std::to_string(vocab) +
            " tokens, not the byte vocabulary's 256: give its tokenizer.json with --tokenizer FILE");
    if (!tokenizer->fits(vocab))
        throw Error(tokenizer->describe() + " does not fit " + model.origin +
                    ", whose vocabulary has " + std::to_string(vocab) +
                    " tokens (a tokenizer.json fits a model of its own vocabulary, padded by at "
                    "most " +
                    std::to_string(kMaxPaddingRows) +
                    " rows): give the model's own tokenizer.json with --tokenizer FILE");
    return tokenizer;
}

int run_export(const ModelSource& source, const std::filesystem::path& out) {
    return with_exit_status([&] {
        const LoadedModel model = load_model(source);
        const std::unique_ptr<Tokenizer> tokenizer = load_model_tokenizer(source, model);
        const ParameterManifest manifest(model.config);
        write_hf_model_dir(out, model.config, manifest, model.params.data(), tokenizer->hf_json());
        std::printf(
            "exported %s (%zu parameters) to %s: model.safetensors, config.json, tokenizer.json, "
            "tokenizer_config.json; tokenizer: %s\n",
            model.origin.c_str(), manifest.total(), out.c_str(), tokenizer->describe().c_str());
        return kExitOk;
    });
}

int run_sample(const ModelSource& source, const std::string& prompt, const SampleOptions& options) {
    return with_exit_status([&] {
        const LoadedModel loaded = load_model(source);
        const std::unique_ptr<Tokenizer> tokenizer = load_model_tokenizer(source, loaded);
        CpuOps<float> ops;
        Model<float> model(loaded.config, ops, 1, loaded.config.context);
        ops.from_host(model.params(), loaded.params.data(), loaded.params.size());
        const std::vector<uint16_t> encoded = tokenizer->encode(prompt);
        const std::vector<int32_t> tokens(encoded.begin(), encoded.end());
        SampleOptions within_vocabulary = options;
        within_vocabulary.vocab = tokenizer->vocab_size();  // never a padding row of the embedding
        const std::vector<int32_t> continuation = continue_tokens(model, tokens, within_vocabulary);
        const std::vector<uint16_t> ids(continuation.begin(), continuation.end());
        const std::string text = prompt + tokenizer->decode(ids);
        std::fwrite(text.data(), 1, text.size(), stdout);
        std::fputc('\n', stdout);
        return kExitOk;
    });
}

}  // namespace starling::cli
