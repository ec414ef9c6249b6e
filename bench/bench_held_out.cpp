// What NoLoCo's held-out check of a partner's weights (optimizer/outer_round.h) adds to a round:
// a forward pass of one batch for this node's weights and one per partner,
// against the H inner steps of training the round holds, measured on the same replica in the same
// run. Medians of --reps repetitions after one warm-up; needs the config's data (train and
// validation shards).
#include <CLI/CLI.hpp>
#include <cstdio>
#include <vector>

#include "bench/median.h"
#include "daemon/config.h"
#include "engine/replica.h"
#include "kernels/backend.h"

using namespace starling;

int main(int argc, char** argv) {
    CLI::App app{
        "bench_held_out: the held-out check of NoLoCo partners against a round's training"};
    std::string config_path = std::string(STARLING_SOURCE_DIR) + "/configs/experiments/swarm.toml";
    int inner_steps = 25, partners = 1, reps = 5;
    app.add_option("--config", config_path, "model, batch and data config");
    app.add_option("--inner-steps", inner_steps, "H: the inner steps of a round");
    app.add_option("--partners", partners, "partners scored per round");
    app.add_option("--reps", reps, "repetitions");
    CLI11_PARSE(app, argc, argv);

    const TrainConfig config = load_train_config(config_path);
    const Backend backend = make_backend({config.device, config.threads, config.matmul});
    Replica replica(config, 1, backend, 0, 1);
    const LrSchedule schedule = config.lr_schedule();
    const double train_s =
        bench::median_seconds(reps, [&] { (void)replica.inner_phase(inner_steps, schedule); });
    const std::vector<float> weights(replica.theta().begin(), replica.theta().end());
    const double check_s = bench::median_seconds(reps, [&] {
        (void)replica.held_out_loss(weights);
        for (int p = 0; p < partners; p++) (void)replica.held_out_loss(weights);
    });
    std::printf("%s on %s: batch %d x %d, H %d, %d partner(s)\n", config_path.c_str(),
                backend.description.c_str(), config.batch_size, config.effective_seq_len(),
                inner_steps, partners);
    std::printf("%-36s %8.3f s\n", "H inner steps (baseline)", train_s);
    std::printf("%-36s %8.3f s  %5.1f%% of the round's training\n", "held-out check", check_s,
                100.0 * check_s / train_s);
    return 0;
}
