// What starlingd adds to a round besides training and the exchange, for a model from a config
// (default configs/124m.toml): packing the round's snapshot (phi, outer momentum, AdamW m and v:
// 16 bytes a parameter; every round), hashing it into the manifest joiners verify (only when one
// fetches it) and writing a checkpoint (fsynced; every checkpoint_every rounds). memcpy of the same
// bytes, measured in the same run, is the baseline. Medians of
// --reps repetitions after one warm-up.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <vector>

#include "bench/median.h"
#include "daemon/config.h"
#include "daemon/swarm/swarm_checkpoint.h"
#include "daemon/swarm/swarm_snapshot.h"
#include "model/manifest.h"
#include "peer/state_sync.h"

using namespace starling;

int main(int argc, char** argv) {
    CLI::App app{"bench_round_overhead: snapshot, manifest and checkpoint costs per round"};
    std::string config_path = std::string(STARLING_SOURCE_DIR) + "/configs/124m.toml";
    std::string dir = "out/bench_round_overhead";
    int reps = 5;
    app.add_option("--config", config_path, "model config");
    app.add_option("--dir", dir, "where checkpoints are written (removed afterwards)");
    app.add_option("--reps", reps, "repetitions");
    CLI11_PARSE(app, argc, argv);

    const TrainConfig config = load_train_config(config_path);
    const ParameterManifest manifest(config.model);
    const size_t n = manifest.total();
    std::vector<float> phi(n, 0.01f), momentum(n, 0.001f), m(n, 1e-4f), v(n, 1e-8f);
    const size_t bytes = swarm_snapshot_bytes(n);
    std::printf("model %s: %zu parameters, snapshot %.1f MB\n", config_path.c_str(), n,
                bytes / 1e6);

    std::vector<std::byte> copy_target(bytes);
    const std::vector<std::byte> source = pack_swarm_snapshot({1, 2, 3}, phi, momentum, m, v);
    const double memcpy_s =
        bench::median_seconds(reps, [&] { std::memcpy(copy_target.data(), source.data(), bytes); });
    const double pack_s = bench::median_seconds(reps, [&] {
        (void)pack_swarm_snapshot({1, 2, 3}, phi, momentum, m, v);
    });
    // What SwarmNode does: refill a buffer a snapshot published a few rounds ago no longer uses.
    const double repack_s = bench::median_seconds(reps, [&] {
        pack_swarm_snapshot_into(copy_target, {1, 2, 3}, phi, momentum, m, v);
    });
    const double manifest_s = bench::median_seconds(reps, [&] {
        const Snapshot snapshot(manifest.fingerprint(), 1, "bench", source);
        (void)snapshot.manifest();
    });
    uint64_t round = 0;
    const double checkpoint_s = bench::median_seconds(reps, [&] {
        auto snapshot =
            std::make_shared<const Snapshot>(manifest.fingerprint(), ++round, "bench", source);
        save_swarm_checkpoint(dir, 2, manifest.fingerprint(), {snapshot, {}});
    });
    std::filesystem::remove_all(dir);

    auto line = [&](const char* what, double s) {
        std::printf("%-38s %8.3f s  %7.2f GB/s  %5.1fx memcpy\n", what, s, bytes / s / 1e9,
                    s / memcpy_s);
    };
    line("memcpy (baseline)", memcpy_s);
    line("pack snapshot, fresh memory", pack_s);
    line("pack snapshot, recycled (every round)", repack_s);
    line("copy + hash manifest (on a fetch)", manifest_s);
    line("copy + checkpoint write (every K)", checkpoint_s);
    return 0;
}
