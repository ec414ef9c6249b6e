// Codec throughput: encode and decode of 124M fp32 values with Q8, Q4, BF16SR and TOPK formats
// on one thread and on two, in input bytes per second, next to memcpy bandwidth measured in the
// same run; bytes per parameter of each. With --step-config, also the inner step (forward,
// backward, AdamW on the CPU) of that config's model at its batch and context, the time TOPK's
// encode is set against. Medians of several repetitions.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include "codec/codec.h"
#include "codec/sparse.h"
#include "common/random.h"
#include "daemon/config.h"
#include "kernels/cpu/cpu_ops.h"
#include "model/model.h"
#include "optimizer/adamw.h"

using namespace starling;
using Clock = std::chrono::steady_clock;

namespace {

template <typename F>
double median_seconds(int reps, F&& run) {
    std::vector<double> times;
    for (int r = 0; r < reps; r++) {
        const auto start = Clock::now();
        run();
        times.push_back(std::chrono::duration<double>(Clock::now() - start).count());
    }
    std::sort(times.begin(), times.end());
    return times[times.size() / 2];
}

struct TopkCase {
    const char* name;
    codec::SparseFormat format;
};

const TopkCase kTopkCases[] = {
    {"TOPK 0.5% 2b", {4096, 20, 2}},
    {"TOPK 1.5% 2b", {4096, 61, 2}},
    {"TOPK 3% 2b", {4096, 123, 2}},
    {"TOPK 1.5% 4b", {4096, 61, 4}},
};

// Median seconds of a CPU training step of the config's model at its batch and context.
double inner_step_seconds(const std::string& config_path, int reps) {
    const TrainConfig config = load_train_config(config_path);
    const int B = config.batch_size, T = config.effective_seq_len();
    CpuOps<float> ops;
    Model<float> model(config.model, ops, B, T);
    model.init_weights(1);
    AdamW<float> adamw(ops, model.manifest(), config.adamw);
    std::vector<int32_t> tokens(static_cast<size_t>(B) * T + 1);
    for (size_t i = 0; i < tokens.size(); i++) {
        tokens[i] = static_cast<int32_t>((i * 131 + 7) % config.model.vocab_size);
    }
    const double step = median_seconds(reps + 1, [&] {
        model.forward(tokens.data(), tokens.data() + 1);
        model.zero_grad();
        model.backward();
        adamw.step(model.params(), model.grads(), 1e-4f);
    });
    std::printf("inner step of %s (%.1fM parameters, batch %d x %d, %d threads): %.2f s\n",
                config_path.c_str(), model.num_params() / 1e6, B, T, cpu_threads(), step);
    return step;
}

}  // namespace

int main(int argc, char** argv) {
    size_t n = 124'000'000;
    int reps = 5;
    CLI::App app{"bench_codec: codec throughput against memcpy"};
    app.add_option("-n,--values", n, "fp32 values per message")->capture_default_str();
    app.add_option("--reps", reps, "repetitions (median reported)")->capture_default_str();
    std::string step_config;
    app.add_option("--step-config", step_config,
                   "also time an inner step of this config's model (e.g. configs/124m.toml)");
    CLI11_PARSE(app, argc, argv);

    // Delta-like values: normal with a small std, so scales are realistic.
    std::vector<float> x(n), y(n), copy(n);
    for (size_t i = 0; i < n; i++) x[i] = static_cast<float>(1e-3 * normal_at(7, i));
    const double gb = static_cast<double>(n) * sizeof(float) / 1e9;

    std::printf("%zu fp32 values (%.2f GB), median of %d runs, GB/s of fp32 input\n\n", n, gb,
                reps);
    std::vector<double> topk_encode_s;
    std::printf("%-8s %8s %10s %10s %12s %12s\n", "codec", "threads", "encode", "decode",
                "enc/memcpy", "dec/memcpy");
    for (int threads : {1, 2}) {
        set_cpu_threads(threads);
        const double memcpy_s =
            median_seconds(reps, [&] { std::memcpy(copy.data(), x.data(), n * sizeof(float)); });
        const double memcpy_gbs = gb / memcpy_s;
        std::printf("%-8s %8d %10.2f %10s\n", "memcpy", threads, memcpy_gbs, "");
        for (codec::Codec c : {codec::Codec::Q8, codec::Codec::Q4, codec::Codec::BF16SR}) {
            std::vector<std::byte> wire(codec::encoded_bytes(c, n));
            const codec::RoundingKey key{1, 2, 3};
            const double enc = median_seconds(reps, [&] { codec::encode(c, x, 0, key, wire); });
            const double dec = median_seconds(reps, [&] { codec::decode(c, wire, y); });
            std::printf("%-8s %8d %10.2f %10.2f %11.0f%% %11.0f%%\n",
                        std::string(codec::codec_name(c)).c_str(), threads, gb / enc, gb / dec,
                        100.0 * (gb / enc) / memcpy_gbs, 100.0 * (gb / dec) / memcpy_gbs);
        }
        // TOPK as a sender runs it: with error feedback (decay 0.95) into a residual.
        std::vector<float> residual(n, 0.0f);
        for (const TopkCase& t : kTopkCases) {
            std::vector<std::byte> wire(codec::sparse_encoded_bytes(t.format, n));
            const codec::RoundingKey key{1, 2, 3};
            const double enc = median_seconds(reps, [&] {
                codec::sparse_encode_with_feedback(t.format, 0.95f, x, residual, 0, key, wire);
            });
            const double dec =
                median_seconds(reps, [&] { codec::sparse_decode(t.format, wire, y); });
            std::printf("%-13s %3d %10.2f %10.2f %11.0f%% %11.0f%%   encode %.3f s\n", t.name,
                        threads, gb / enc, gb / dec, 100.0 * (gb / enc) / memcpy_gbs,
                        100.0 * (gb / dec) / memcpy_gbs, enc);
            if (threads == 2) topk_encode_s.push_back(enc);
        }
    }
    std::printf("\nbytes per parameter on the wire (no framing, no zstd):");
    for (codec::Codec c :
         {codec::Codec::F32, codec::Codec::BF16SR, codec::Codec::Q8, codec::Codec::Q4}) {
        std::printf("  %s %.4f", std::string(codec::codec_name(c)).c_str(),
                    static_cast<double>(codec::encoded_bytes(c, n)) / n);
    }
    std::printf("\n");
    for (const TopkCase& t : kTopkCases) {
        const double per = static_cast<double>(codec::sparse_encoded_bytes(t.format, n)) / n;
        std::printf("  %s %.4f (%.0fx smaller than F32)", t.name, per, 4.0 / per);
    }
    std::printf("\n");
    if (!step_config.empty()) {
        const double step = inner_step_seconds(step_config, 2);
        for (size_t i = 0; i < topk_encode_s.size(); i++) {
            std::printf("%s encode on 2 threads: %.1f%% of that inner step\n", kTopkCases[i].name,
                        100.0 * topk_encode_s[i] / step);
        }
    }
    return 0;
}
