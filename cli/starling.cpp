// starling: the operator's command line. For now it prepares data, trains one node and runs
// in-process swarm experiments; the swarm commands (join, leave, status, peers, watch) arrive with
// the daemon.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <spdlog/spdlog.h>

#include "daemon/config.h"
#include "daemon/trainer.h"
#include "data/corpus.h"
#include "data/prepare.h"
#include "experiment/experiment.h"

namespace {

struct TrainFlags {
    std::string config_path;
    std::optional<int64_t> steps;
    std::optional<int> threads;
    std::optional<std::string> run_dir;
    std::optional<std::string> data_dir;
    std::optional<uint64_t> seed;
    std::optional<uint64_t> node_id;
    bool fresh = false;
};

int run_train(const TrainFlags& flags) {
    starling::TrainConfig config = starling::load_train_config(flags.config_path);
    if (flags.steps) config.steps = *flags.steps;
    if (flags.threads) config.threads = *flags.threads;
    if (flags.run_dir) config.run_dir = *flags.run_dir;
    if (flags.data_dir) config.data.dir = *flags.data_dir;
    if (flags.seed) config.seed = *flags.seed;
    if (flags.node_id) config.data.node_id = *flags.node_id;
    if (flags.fresh) config.resume = false;
    config.validate();
    starling::Trainer trainer(config);
    if (trainer.step() >= config.steps) {
        spdlog::info("run {} already reached step {}; nothing to do (use --fresh to start over "
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

struct PrepareFlags {
    std::string input;
    std::string out = "out/kjv";
    double val_fraction = 0.05;
};

int run_prepare(const PrepareFlags& flags) {
    const std::string text = flags.input.empty() ? starling::read_kjv_text()
                                                 : starling::read_text_file(flags.input);
    starling::PrepareOptions options;
    options.out_dir = flags.out;
    options.val_fraction = flags.val_fraction;
    const starling::PrepareResult r = starling::prepare_shards(text, options);
    spdlog::info("{}: {} tokens ({} train in {} shard(s), {} validation)", flags.out,
                 r.total_tokens, r.train_tokens, r.train_paths.size(), r.val_tokens);
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    spdlog::set_pattern("[%H:%M:%S] %^%l%$ %v");
    CLI::App app{"starling: train one language model across a swarm of machines"};
    app.require_subcommand(1);

    TrainFlags train;
    CLI::App* train_cmd = app.add_subcommand("train", "train one node from a config file");
    train_cmd->add_option("-c,--config", train.config_path, "TOML config (see configs/)")->required();
    train_cmd->add_option("--steps", train.steps, "total optimizer steps");
    train_cmd->add_option("--threads", train.threads, "CPU threads (0 = all cores)");
    train_cmd->add_option("--run-dir", train.run_dir, "checkpoint directory");
    train_cmd->add_option("--data-dir", train.data_dir, "directory of prepared shards");
    train_cmd->add_option("--seed", train.seed, "initialisation seed");
    train_cmd->add_option("--node-id", train.node_id, "seeds this node's data order");
    train_cmd->add_flag("--fresh", train.fresh, "ignore existing checkpoints and start from step 0");

    CLI::App* data_cmd = app.add_subcommand("data", "prepare training data");
    data_cmd->require_subcommand(1);
    PrepareFlags prepare;
    CLI::App* prepare_cmd =
        data_cmd->add_subcommand("prepare", "turn text into byte-token train/val shards");
    prepare_cmd->add_option("--input", prepare.input, "text file (default: the KJV Bible)");
    prepare_cmd->add_option("--out", prepare.out, "output directory")->capture_default_str();
    prepare_cmd->add_option("--val-fraction", prepare.val_fraction, "held-out tail of the text")
        ->capture_default_str();

    ExperimentFlags experiment;
    CLI::App* experiment_cmd = app.add_subcommand(
        "experiment", "train N replicas in one process over a simulated exchange (see "
                      "configs/experiments/)");
    experiment_cmd->add_option("-c,--config", experiment.config_path, "experiment TOML config")
        ->required();
    experiment_cmd->add_option("--name", experiment.name, "run name: the CSV's file name");
    experiment_cmd->add_option("--out-dir", experiment.out_dir, "where the CSVs go");
    experiment_cmd->add_option("--data-dir", experiment.data_dir, "directory of prepared shards");
    experiment_cmd->add_option("--seed", experiment.seed,
                               "initialisation, node ids, data order and rounding");
    experiment_cmd->add_option("--steps", experiment.steps, "inner steps per replica");
    experiment_cmd->add_option("--threads", experiment.threads, "CPU threads (0 = all cores)");

    CLI11_PARSE(app, argc, argv);
    try {
        if (train_cmd->parsed()) return run_train(train);
        if (prepare_cmd->parsed()) return run_prepare(prepare);
        if (experiment_cmd->parsed()) return run_experiment(experiment);
    } catch (const std::exception& e) {  // starling::Error, and anything the libraries throw
        std::fprintf(stderr, "error: %s\n", e.what());
        return 1;
    }
    return 0;
}
