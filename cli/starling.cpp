// starling: the operator's command line. It prepares data, trains one node, runs in-process swarm
// experiments, checks a node's config before starlingd starts, talks to a running starlingd
// through its Control API (status, peers, watch, join, leave), and exports and samples the model
// from a node's checkpoints.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <spdlog/spdlog.h>
#include <string>
#include <vector>

#include "cli/check.h"
#include "cli/completion.h"
#include "cli/control_client.h"
#include "cli/model_commands.h"
#include "cli/node_commands.h"
#include "common/atomic_file.h"
#include "daemon/config.h"
#include "engine/config_reader.h"
#include "daemon/trainer.h"
#include "data/bpe_trainer.h"
#include "data/corpus.h"
#include "data/prepare.h"
#include "data/shard.h"
#include "daemon/swarm/node_config.h"
#include "experiment/experiment.h"
#include "sim/swarm_sim.h"
#include "sim/sim_config.h"
#include "common/openmp_wait.h"

namespace {

struct TrainFlags {
    std::string config_path;
    std::optional<int64_t> steps;
    std::optional<int> threads;
    std::optional<std::string> device;
    std::optional<std::string> matmul;
    std::optional<std::string> run_dir;
    std::optional<std::string> data_dir;
    std::optional<uint64_t> seed;
    std::optional<uint64_t> node_id;
    bool fresh = false;
};

int run_train(const TrainFlags& flags) {
    starling::TrainConfig config = starling::load_train_config(flags.config_path);
    // starlingd's keys ([peer].secret...) may be set for it in the same shell.
    starling::warn_unknown_starling_variables(starling::node_config_keys());
    if (flags.steps) config.steps = *flags.steps;
    if (flags.threads) config.threads = *flags.threads;
    if (flags.device) config.device = *flags.device;
    if (flags.matmul) config.matmul = *flags.matmul;
    if (flags.run_dir) config.run_dir = *flags.run_dir;
    if (flags.data_dir) config.data.dir = *flags.data_dir;
    if (flags.seed) config.seed = *flags.seed;
    if (flags.node_id) config.data.node_id = *flags.node_id;
    if (flags.fresh) config.resume = false;
    config.validate();
    starling::Trainer trainer(config);
    if (trainer.step() >= config.steps) {
        spdlog::info(
            "run {} already reached step {}; nothing to do (use --fresh to start over "
            "or --steps to go further)",
            config.run_dir, trainer.step());
        return 0;
    }
    const starling::TrainSummary summary = trainer.run();
    spdlog::info("done: {} steps, {:.0f} tok/s, final val loss {:.4f}", summary.steps.size(),
                 summary.tokens_per_second, summary.val_loss.value_or(NAN));
    return 0;
}

struct ExperimentFlags {
    std::string config_path;
    std::optional<std::string> name;
    std::optional<std::string> out_dir;
    std::optional<std::string> data_dir;
    std::optional<uint64_t> seed;
    std::optional<int64_t> steps;
    std::optional<int> threads;
};

int run_experiment(const ExperimentFlags& flags) {
    starling::ExperimentConfig config = starling::load_experiment_config(flags.config_path);
    if (flags.name) config.name = *flags.name;
    if (flags.out_dir) config.out_dir = *flags.out_dir;
    if (flags.data_dir) config.train.data.dir = *flags.data_dir;
    if (flags.seed) config.train.seed = *flags.seed;
    if (flags.steps) config.train.steps = *flags.steps;
    if (flags.threads) config.train.threads = *flags.threads;
    config.validate();
    starling::run_experiment(config);
    return 0;
}

struct SimulateFlags {
    std::string config_path;
    std::optional<uint64_t> seed;
    std::optional<int> nodes;
    std::optional<double> seconds;
};

int run_simulate(const SimulateFlags& flags) {
    starling::sim::SimConfig config = starling::sim::load_sim_config(flags.config_path);
    if (flags.seed) config.seed = *flags.seed;
    if (flags.nodes) config.nodes = *flags.nodes;
    if (flags.seconds) config.seconds = *flags.seconds;
    const starling::sim::Figures figures = starling::sim::simulate_swarm(config);
    std::fputs(starling::sim::format_figures(config, figures).c_str(), stdout);
    return 0;
}

struct PrepareFlags {
    std::string input;
    std::string out = "out/kjv";
    std::string tokenizer;
    std::string config;  // take out and tokenizer from its [data], unless already prepared
    double val_fraction = 0.05;
};

std::string read_input(const std::string& input) {
    return input.empty() ? starling::read_kjv_text() : starling::read_text_file(input);
}

// Why the shards in dir cannot serve a node reading them with tokenizer ("" when they can): none
// there yet (the validation split is written last, so a missing one means unfinished), or
// prepared with another tokenizer.
std::string unprepared_reason(const std::string& dir, const std::string& tokenizer) {
    try {
        starling::list_shards(dir, "val");
        starling::check_shards_tokenizer(dir, tokenizer);
        return "";
    } catch (const starling::Error& e) {
        return e.what();
    }
}

int run_prepare(PrepareFlags flags) {
    // A service's start-up step (the systemd unit, the container's entry point) prepares what its
    // config reads, with the config's tokenizer, and only once.
    if (!flags.config.empty()) {
        const starling::DataConfig data = starling::load_train_config(flags.config).data;
        const std::string reason = unprepared_reason(data.dir, data.tokenizer);
        if (reason.empty()) {
            spdlog::info("{}: prepared for {} already; nothing to do", data.dir, flags.config);
            return 0;
        }
        spdlog::info("{}: preparing ({})", data.dir, reason);
        flags.out = data.dir;
        flags.tokenizer = data.tokenizer;
    }
    const std::string text = read_input(flags.input);
    starling::PrepareOptions options;
    options.out_dir = flags.out;
    options.tokenizer = flags.tokenizer;
    options.val_fraction = flags.val_fraction;
    const starling::PrepareResult r = starling::prepare_shards(text, options);
    spdlog::info(
        "{}: {} tokens ({} train in {} shard(s), {} validation), vocabulary {}, {:.3f} tokens per byte",
        flags.out, r.total_tokens, r.train_tokens, r.train_paths.size(), r.val_tokens, r.vocab_size,
        double(r.total_tokens) / double(text.size()));
    return 0;
}

struct TrainTokenizerFlags {
    std::string input;
    std::string out;
    int vocab_size = 0;
};

int run_train_tokenizer(const TrainTokenizerFlags& flags) {
    const std::string text = read_input(flags.input);
    const auto start = std::chrono::steady_clock::now();
    const starling::TrainedBpe trained = starling::train_bpe(text, flags.vocab_size);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (const std::filesystem::path parent = std::filesystem::path(flags.out).parent_path();
        !parent.empty())
        std::filesystem::create_directories(parent);
    starling::write_file_atomic(flags.out, trained.hf_json);
    spdlog::info("{}: {} tokens ({} merges) learned from {} bytes in {:.1f} s", flags.out,
                 trained.token_bytes.size(), trained.merges.size(), text.size(), seconds);
    if (trained.token_bytes.size() < size_t(flags.vocab_size))
        spdlog::warn("the text ran out of pairs to merge below the {} tokens asked for",
                     flags.vocab_size);
    return 0;
}

// The commands that talk to a running node through its Control API, and their options.
struct NodeCommands {
    bool status_json = false;
    bool peers_json = false;
    starling::cli::WatchOptions watch_options;
    std::vector<std::string> seeds;
    CLI::App* status = nullptr;
    CLI::App* peers = nullptr;
    CLI::App* watch = nullptr;
    CLI::App* join = nullptr;
    CLI::App* leave = nullptr;

    explicit NodeCommands(CLI::App& app) {
        status = app.add_subcommand(
            "status", "show the node's round, phase, losses, peers, exchanges and checkpoint");
        status->add_flag("--json", status_json,
                         "print the NodeStatus message as JSON, every field included");

        peers = app.add_subcommand(
            "peers",
            "list the swarm members the node knows: address, state, round, compatibility, rtt, exchanges");
        peers->add_flag("--json", peers_json, "print the ListPeersResponse message as JSON");

        watch = app.add_subcommand(
            "watch",
            "follow the node's status live: a table redrawn in place on a terminal, one line per update "
            "otherwise; ends on Ctrl-C, after --count updates or when the node leaves");
        watch
            ->add_option(
                "--interval-ms", watch_options.interval_ms,
                "time between updates (0: the node's default, 1000; the node refuses less than 50)")
            ->check(CLI::Range(0, 3600 * 1000))
            ->capture_default_str();
        // CLI11 would wrap "-1" around to a count no one reaches.
        const CLI::Validator not_negative(
            [](std::string& text) {
                return text.rfind('-', 0) == 0 ? std::string("must not be negative") : "";
            },
            "");
        watch
            ->add_option("--count", watch_options.count,
                         "stop after this many updates (0: no limit)")
            ->check(not_negative)
            ->capture_default_str();

        join =
            app.add_subcommand("join",
                               "give the running node members to join the swarm through; it dials "
                               "each before it answers and keeps those that answered (exit 1 "
                               "naming any other)");
        join->add_option("seeds", seeds, "HOST:PORT of members (the address they announce)")
            ->required();

        leave = app.add_subcommand(
            "leave",
            "make the node drain: it finishes the round, writes a checkpoint, tells its peers and exits 0");

        // A command's help cannot list the app's own options, so it says where --control goes.
        for (CLI::App* command : {status, peers, watch, join, leave})
            command->footer(
                "The node: --control HOST:PORT or unix:/path, before or after the command (default: "
                "STARLING_CONTROL, else " +
                std::string(starling::cli::kDefaultControlAddress) +
                ").\nExit status: 0 done, 1 bad input or an error from the node, 2 no node answered.");
    }

    // The exit status of the command given, if it is one of these.
    std::optional<int> run(const std::string& control) const {
        const bool given = status->parsed() || peers->parsed() || watch->parsed() ||
                           join->parsed() || leave->parsed();
        if (!given) return std::nullopt;
        if (!starling::cli::is_control_address(control)) {
            std::fprintf(stderr,
                         "error: control address '%s' is not host:port or unix:/path (--control or "
                         "STARLING_CONTROL)\n",
                         control.c_str());
            return starling::cli::kExitError;
        }
        if (status->parsed()) return starling::cli::run_status(control, status_json);
        if (peers->parsed()) return starling::cli::run_peers(control, peers_json);
        if (watch->parsed()) return starling::cli::run_watch(control, watch_options);
        if (join->parsed()) return starling::cli::run_join(control, seeds);
        if (leave->parsed()) return starling::cli::run_leave(control);
        return std::nullopt;
    }
};

// `starling check`: its flags are starlingd's, so they mean what they mean to the daemon.
struct CheckCommand {
    starling::cli::CheckOptions options;
    CLI::App* command = nullptr;

    explicit CheckCommand(CLI::App& app) {
        command = app.add_subcommand(
            "check",
            "preflight before starting starlingd: the config, device, data, data directory and free "
            "space, ports, announce address, seeds and credentials; exit 1 when any check fails");
        starling::NodeFlags& flags = options.flags;
        command
            ->add_option("-c,--config", options.config_path,
                         "the node's TOML config (see configs/)")
            ->required();
        const std::vector<starling::KeyDescription> keys = starling::node_config_keys();
        using starling::key_help;
        command->add_option("--data-dir", flags.data_dir, key_help(keys, "node", "data_dir"));
        command->add_option("--listen", flags.listen, key_help(keys, "peer", "listen"));
        command->add_option("--announce", flags.announce, key_help(keys, "peer", "announce"));
        command->add_option("--seed", flags.seeds,
                            "HOST:PORT of a member, added to [peer].seeds (repeatable)");
        command->add_option("--control", flags.control, key_help(keys, "control", "listen"));
        command->add_option("--metrics", flags.metrics, key_help(keys, "metrics", "listen"));
    }
};

// `starling export` and `starling sample`: where the model comes from, the same for both.
struct ModelCommands {
    starling::cli::ModelSource source;
    std::string out;
    std::string prompt;
    starling::SampleOptions sample_options;
    CLI::App* export_cmd = nullptr;
    CLI::App* sample_cmd = nullptr;

    explicit ModelCommands(CLI::App& app) {
        export_cmd = app.add_subcommand(
            "export",
            "write a node's model as a Hugging Face directory (model.safetensors, config.json and its "
            "tokenizer.json): the running node's, or with --config its newest checkpoint (else "
            "starling train's)");
        add_source(export_cmd);
        export_cmd->add_option("--hf", out, "the directory to write (created if missing)")
            ->required();

        sample_cmd = app.add_subcommand(
            "sample",
            "print text the model writes after a prompt: the running node's model, or a checkpoint's");
        add_source(sample_cmd);
        sample_cmd->add_option(
            "--model", source.hf_dir,
            "a Hugging Face directory instead: an export, or a `starling train` checkpoint step");
        sample_cmd->add_option("-p,--prompt", prompt, "the text to continue")->required();
        sample_cmd->add_option("-n,--tokens", sample_options.tokens, "tokens to add")
            ->check(CLI::Range(0, 1 << 20))
            ->capture_default_str();
        sample_cmd
            ->add_option("--temperature", sample_options.temperature,
                         "0: always the most likely token")
            ->check(CLI::Range(0.0, 100.0))
            ->capture_default_str();
        sample_cmd
            ->add_option("--top-k", sample_options.top_k, "draw among the k most likely (0: all)")
            ->check(CLI::Range(0, 1 << 20))
            ->capture_default_str();
        sample_cmd->add_option("--seed", sample_options.seed, "the draws' seed")
            ->capture_default_str();
    }

    void add_source(CLI::App* command) {
        command->footer(
            "The model: with --config, the node's newest checkpoint that reads back whole, else "
            "starling train's in [checkpoint].dir (or --checkpoint); otherwise the running node's, through its Control API at --control (default: "
            "STARLING_CONTROL, else " +
            std::string(starling::cli::kDefaultControlAddress) +
            ").\nExit status: 0 done, 1 bad input or an error, 2 no node answered.");
        command->add_option("-c,--config", source.config_path,
                            "the node's TOML config: its model and data directory");
        command->add_option("--data-dir", source.data_dir,
                            "[node].data_dir, where checkpoints/ is");
        command->add_option(
            "--checkpoint", source.checkpoint,
            "one checkpoint directory instead of the newest that reads back whole: a node's "
            "(checkpoints/step_*) or starling train's (its run directory's step_*)");
        command->add_option(
            "--tokenizer", source.tokenizer,
            "the model's tokenizer.json (default: the config's [data].tokenizer, the --model "
            "directory's tokenizer.json, else bytes)");
    }

    std::optional<int> run(const std::string& control) {
        source.control = control;
        if (export_cmd->parsed()) return starling::cli::run_export(source, out);
        if (sample_cmd->parsed()) return starling::cli::run_sample(source, prompt, sample_options);
        return std::nullopt;
    }
};

// Edits (insert, delete, replace, swap two neighbours) that turn a into b: optimal string
// alignment.
size_t edit_distance(const std::string& a, const std::string& b) {
    std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
    for (size_t i = 0; i <= a.size(); i++) d[i][0] = i;
    for (size_t j = 0; j <= b.size(); j++) d[0][j] = j;
    for (size_t i = 1; i <= a.size(); i++)
        for (size_t j = 1; j <= b.size(); j++) {
            d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1,
                                d[i - 1][j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
            if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
                d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
        }
    return d[a.size()][b.size()];
}

// "unknown command 'stauts' (did you mean 'status'?)": the command nearest the word is suggested
// when two edits or fewer make it.
std::string unknown_command_message(CLI::App& app, const std::string& word) {
    std::string nearest;
    size_t best = 3;
    for (const CLI::App* command : app.get_subcommands({})) {
        const size_t distance = edit_distance(word, command->get_name());
        if (distance < best) {
            best = distance;
            nearest = command->get_name();
        }
    }
    return "error: unknown command '" + word + "'" +
           (nearest.empty() ? "" : " (did you mean '" + nearest + "'?)") +
           "; starling --help lists the commands";
}

// The keys of a command's config file, under its --help.
std::string config_keys_footer(const std::vector<starling::KeyDescription>& keys) {
    return "\nConfig keys (TOML [section] key = default; each also STARLING_<SECTION>_<KEY>):\n" +
           starling::keys_as_text(keys);
}

}  // namespace

int main(int argc, char** argv) {
    starling::restart_unless_openmp_wait_policy_set(argv);
    spdlog::set_pattern("[%H:%M:%S] %^%l%$ %v");
    CLI::App app{"starling: train one language model across a swarm of machines"};
    app.set_version_flag("--version", "starling " STARLING_VERSION);
    app.require_subcommand(1);
    // Options of the app itself, such as --control, may also follow the command's name.
    app.fallthrough();
    std::string control = starling::cli::default_control_address();
    CLI::Option* control_option = app.add_option(
        "--control", control,
        "the node's Control API: host:port or unix:/path (default: STARLING_CONTROL, else " +
            std::string(starling::cli::kDefaultControlAddress) + ")");

    TrainFlags train;
    CLI::App* train_cmd = app.add_subcommand("train", "train one node from a config file");
    train_cmd->add_option("-c,--config", train.config_path, "TOML config (see configs/)")
        ->required();
    const std::vector<starling::KeyDescription> train_keys = starling::train_config_keys();
    using starling::key_help;
    train_cmd->add_option("--steps", train.steps, key_help(train_keys, "train", "steps"));
    train_cmd->add_option("--threads", train.threads, key_help(train_keys, "train", "threads"));
    train_cmd->add_option("--device", train.device, key_help(train_keys, "train", "device"));
    train_cmd->add_option("--matmul", train.matmul, key_help(train_keys, "train", "matmul"));
    train_cmd->add_option("--run-dir", train.run_dir, key_help(train_keys, "checkpoint", "dir"));
    train_cmd->add_option("--data-dir", train.data_dir, key_help(train_keys, "data", "dir"));
    train_cmd->add_option("--seed", train.seed, key_help(train_keys, "train", "seed"));
    train_cmd->add_option("--node-id", train.node_id, key_help(train_keys, "data", "node_id"));
    train_cmd->add_flag("--fresh", train.fresh,
                        "ignore existing checkpoints and start from step 0");
    train_cmd->footer(config_keys_footer(train_keys));

    CLI::App* data_cmd = app.add_subcommand("data", "prepare training data");
    data_cmd->require_subcommand(1);
    PrepareFlags prepare;
    CLI::App* prepare_cmd = data_cmd->add_subcommand(
        "prepare", "turn text into train/val token shards (bytes, or --tokenizer)");
    prepare_cmd->add_option("--input", prepare.input, "text file (default: the KJV Bible)");
    CLI::Option* prepare_out =
        prepare_cmd->add_option("--out", prepare.out, "output directory")->capture_default_str();
    prepare_cmd->add_option("--val-fraction", prepare.val_fraction, "held-out tail of the text")
        ->capture_default_str();
    CLI::Option* prepare_tokenizer = prepare_cmd->add_option(
        "--tokenizer", prepare.tokenizer,
        "a byte-level BPE tokenizer.json (default: bytes, vocabulary 256); copied into --out");
    prepare_cmd
        ->add_option("--config", prepare.config,
                     "a config file: prepare its [data].dir with its [data].tokenizer "
                     "(STARLING_DATA_* apply), unless that is done already")
        ->excludes(prepare_out)
        ->excludes(prepare_tokenizer);
    TrainTokenizerFlags train_tokenizer;
    CLI::App* train_tokenizer_cmd = data_cmd->add_subcommand(
        "train-tokenizer",
        "learn byte-level BPE merges from text and write them as a Hugging Face tokenizer.json");
    train_tokenizer_cmd->add_option("--input,--text", train_tokenizer.input,
                                    "text file (default: the KJV Bible)");
    train_tokenizer_cmd->add_option("--out", train_tokenizer.out, "the tokenizer.json to write")
        ->required();
    train_tokenizer_cmd
        ->add_option("--vocab-size", train_tokenizer.vocab_size,
                     "tokens in all: 256 bytes, one per merge, and <|endoftext|> (the last id)")
        ->required()
        ->check(CLI::Range(257, 65536));

    ExperimentFlags experiment;
    CLI::App* experiment_cmd =
        app.add_subcommand("experiment",
                           "train N replicas in one process over a simulated exchange (see "
                           "configs/experiments/)");
    experiment_cmd->add_option("-c,--config", experiment.config_path, "experiment TOML config")
        ->required();
    const std::vector<starling::KeyDescription> experiment_keys =
        starling::experiment_config_keys();
    experiment_cmd->add_option("--name", experiment.name,
                               key_help(experiment_keys, "experiment", "name"));
    experiment_cmd->add_option("--out-dir", experiment.out_dir,
                               key_help(experiment_keys, "experiment", "out_dir"));
    experiment_cmd->add_option("--data-dir", experiment.data_dir,
                               key_help(experiment_keys, "data", "dir"));
    experiment_cmd->add_option("--seed", experiment.seed,
                               key_help(experiment_keys, "train", "seed") +
                                   "; also the node ids, data order and rounding");
    experiment_cmd->add_option("--steps", experiment.steps,
                               key_help(experiment_keys, "train", "steps"));
    experiment_cmd->add_option("--threads", experiment.threads,
                               key_help(experiment_keys, "train", "threads"));
    experiment_cmd->footer(config_keys_footer(experiment_keys));

    SimulateFlags simulate;
    CLI::App* simulate_cmd = app.add_subcommand(
        "simulate",
        "run the membership protocol of a swarm of simulated nodes on a simulated network, "
        "replayable from a seed (see configs/sim/, docs/scale.md)");
    simulate_cmd->add_option("-c,--config", simulate.config_path, "simulation TOML config")
        ->required();
    const std::vector<starling::KeyDescription> sim_keys = starling::sim::sim_config_keys();
    simulate_cmd->add_option("--seed", simulate.seed, key_help(sim_keys, "sim", "seed"));
    simulate_cmd->add_option("--nodes", simulate.nodes, key_help(sim_keys, "sim", "nodes"));
    simulate_cmd->add_option("--seconds", simulate.seconds, key_help(sim_keys, "sim", "seconds"));
    simulate_cmd->footer(config_keys_footer(sim_keys));

    CLI::App* config_cmd = app.add_subcommand("config", "what a config file may hold");
    config_cmd->require_subcommand(1);
    std::string keys_for = "node";
    bool keys_markdown = false;
    CLI::App* keys_cmd = config_cmd->add_subcommand(
        "keys", "every key of a config file: section, name, default, range and meaning");
    keys_cmd
        ->add_option("--for", keys_for,
                     "whose file: train (starling train), experiment (starling experiment), "
                     "simulate (starling simulate) or node (starlingd)")
        ->capture_default_str()
        ->check(CLI::IsMember({"train", "experiment", "simulate", "node"}));
    keys_cmd->add_flag("--markdown", keys_markdown, "Markdown tables, one per section");

    NodeCommands node(app);
    CheckCommand check(app);
    ModelCommands model(app);

    std::string completion_shell;
    CLI::App* completion_cmd = app.add_subcommand(
        "completion",
        "print a shell completion script for starling: `source <(starling completion bash)`, or put "
        "it where bash-completion or zsh finds it");
    completion_cmd->add_option("shell", completion_shell, "bash or zsh")
        ->required()
        ->check(CLI::IsMember({"bash", "zsh"}));

    try {
        app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
        // A word where the command belongs is left over, and CLI11 would only say that a command
        // is required.
        const std::vector<std::string> left = app.remaining();
        if (app.get_subcommands().empty() && !left.empty() && left.front().rfind('-', 0) != 0) {
            std::fprintf(stderr, "%s\n", unknown_command_message(app, left.front()).c_str());
            return 1;
        }
        // --help is a ParseError too, with code 0; any real mistake on the command line is bad
        // input.
        return app.exit(e) == 0 ? 0 : 1;
    }
    try {
        if (completion_cmd->parsed()) {
            const std::string script = completion_shell == "bash"
                                           ? starling::cli::bash_completion(app, "starling")
                                           : starling::cli::zsh_completion(app, "starling");
            std::fputs(script.c_str(), stdout);
            return 0;
        }
        if (keys_cmd->parsed()) {
            const std::vector<starling::KeyDescription> keys =
                keys_for == "train"        ? starling::train_config_keys()
                : keys_for == "experiment" ? starling::experiment_config_keys()
                : keys_for == "simulate"   ? starling::sim::sim_config_keys()
                                           : starling::node_config_keys();
            const std::string text =
                keys_markdown ? starling::keys_as_markdown(keys) : starling::keys_as_text(keys);
            std::fputs(text.c_str(), stdout);
            return 0;
        }
        if (train_cmd->parsed()) return run_train(train);
        if (prepare_cmd->parsed()) return run_prepare(prepare);
        if (train_tokenizer_cmd->parsed()) return run_train_tokenizer(train_tokenizer);
        if (experiment_cmd->parsed()) return run_experiment(experiment);
        if (simulate_cmd->parsed()) return run_simulate(simulate);
        if (const std::optional<int> status = node.run(control)) return *status;
        if (const std::optional<int> status = model.run(control)) return *status;
        if (check.command->parsed()) {
            // `starling --control ADDR check` means the same as `starling check --control ADDR`.
            if (!check.options.flags.control && control_option->count() > 0)
                check.options.flags.control = control;
            return starling::cli::run_check(check.options);
        }
    } catch (const std::exception& e) {  // starling::Error, and anything the libraries throw
        std::fprintf(stderr, "error: %s\n", e.what());
        return 1;
    }
    return 0;
}
