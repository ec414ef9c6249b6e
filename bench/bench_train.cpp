// Training throughput on the CPU backend: tokens/s, achieved GFLOP/s (6 x parameters plus
// attention FLOPs per token) and peak RSS per model, next to OpenBLAS's own sgemm GFLOP/s
// measured in the same run as the ceiling. Each model runs in a fresh child process (this binary
// again, with --only; fork would inherit a broken OpenMP pool) so its peak RSS is its own.
// Prints medians over the timed steps.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cblas.h>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <sys/resource.h>
#include <string>
#include <vector>

#include "kernels/cpu/cpu_ops.h"
#include "model/model.h"
#include "optimizer/adamw.h"
#include "common/openmp_wait.h"

using namespace starling;
using Clock = std::chrono::steady_clock;

namespace {

struct BenchModel {
    const char* name;
    ModelConfig config;
    int B, T;
};

ModelConfig make_config(int layers, int heads, int channels, int ff, int context) {
    ModelConfig c;
    c.n_layer = layers;
    c.n_head = heads;
    c.d_model = channels;
    c.d_ff = ff;
    c.vocab_size = 256;
    c.context = context;
    return c;
}

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

double seconds_since(Clock::time_point start) {
    return std::chrono::duration<double>(Clock::now() - start).count();
}

// Median GFLOP/s of C (M,N) = A (M,K) @ B (N,K)^T, the shape our forward matmuls use.
double sgemm_gflops(int M, int N, int K, int reps) {
    std::vector<float> a(static_cast<size_t>(M) * K, 0.5f), b(static_cast<size_t>(N) * K, 0.25f);
    std::vector<float> c(static_cast<size_t>(M) * N);
    std::vector<double> times;
    for (int r = 0; r < reps + 2; r++) {
        const auto start = Clock::now();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, 1.0f, a.data(), K, b.data(),
                    K, 0.0f, c.data(), N);
        if (r >= 2) times.push_back(seconds_since(start));
    }
    return 2.0 * M * N * K / median(times) / 1e9;
}

void run_model(const BenchModel& m, int steps) {
    CpuOps<float> ops;
    Model<float> model(m.config, ops, m.B, m.T);
    model.init_weights(1);
    AdamW<float> adamw(ops, model.manifest(), AdamWConfig{});
    std::vector<int32_t> tokens(static_cast<size_t>(m.B) * m.T + 1);
    for (size_t i = 0; i < tokens.size(); i++)
        tokens[i] = static_cast<int32_t>((i * 131 + 7) % 256);
    std::vector<double> times;
    for (int s = 0; s < steps + 3; s++) {  // the first steps warm caches and page in arenas
        const auto start = Clock::now();
        model.forward(tokens.data(), tokens.data() + 1);
        model.zero_grad();
        model.backward();
        adamw.step(model.params(), model.grads(), 1e-4f);
        if (s >= 3) times.push_back(seconds_since(start));
    }
    const double step = median(times);
    const double tokens_per_s = m.B * m.T / step;
    const double gflops = tokens_per_s * m.config.flops_per_token(m.T) / 1e9;
    rusage usage{};
    getrusage(RUSAGE_SELF, &usage);
    std::printf("%-28s %10.2fM %5dx%-5d %9.1f ms %10.0f %9.1f %9.1f\n", m.name,
                model.num_params() / 1e6, m.B, m.T, step * 1e3, tokens_per_s, gflops,
                usage.ru_maxrss / 1024.0);
    std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
    starling::restart_unless_openmp_wait_policy_set(argv);
    int threads = 2, steps = 20, only = -1;
    CLI::App app{"bench_train: CPU training throughput"};
    app.add_option("--threads", threads, "threads (0 = all cores)")->capture_default_str();
    app.add_option("--steps", steps, "timed steps per model (median reported)")
        ->capture_default_str();
    app.add_option("--only", only, "run just model number N, without the header (internal)");
    CLI11_PARSE(app, argc, argv);
    set_cpu_threads(threads);

    const std::vector<BenchModel> models = {
        {"nano (L4 C128 F384)", make_config(4, 4, 128, 384, 128), 8, 128},
        {"L4 H4 C256 F704", make_config(4, 4, 256, 704, 128), 4, 128},
    };
    if (only >= 0) {
        if (only >= static_cast<int>(models.size())) return 2;
        run_model(models[only], steps);
        return 0;
    }

    std::printf("threads %d, OMP_WAIT_POLICY %s, median of %d steps after 3 warm-up steps\n\n",
                cpu_threads(), std::getenv("OMP_WAIT_POLICY"), steps);
    std::printf("OpenBLAS sgemm, same process (the ceiling):\n");
    std::printf("  1024 x 1024 x 1024       %8.1f GFLOP/s\n", sgemm_gflops(1024, 1024, 1024, 10));
    std::printf("  512 x 768 x 256 (qkv)    %8.1f GFLOP/s\n", sgemm_gflops(512, 768, 256, 50));
    std::printf("  512 x 1408 x 256 (mlp)   %8.1f GFLOP/s\n\n", sgemm_gflops(512, 1408, 256, 50));

    std::printf("%-28s %11s %11s %12s %10s %9s %9s\n", "model", "params", "B x T", "step", "tok/s",
                "GFLOP/s", "RSS MiB");
    const std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
    for (size_t i = 0; i < models.size(); i++) {
        std::fflush(stdout);
        const std::string child = "'" + self + "' --threads " + std::to_string(threads) +
                                  " --steps " + std::to_string(steps) + " --only " +
                                  std::to_string(i);
        if (std::system(child.c_str()) != 0) {
            std::fprintf(stderr, "%s: benchmark child failed\n", models[i].name);
            return 1;
        }
    }
    return 0;
}
