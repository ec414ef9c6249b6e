// Training throughput on the CUDA backend for one model (configs/124m.toml at context 1024 by
// default): tokens/s, model FLOP/s (6 x parameters plus attention per token, as bench_train),
// MFU against the device's peak for the matmuls' precision (from the table below, keyed by device
// name; "unknown" for other devices) and peak device memory. A large cuBLAS gemm in the same
// precision, timed in the same run, is the practical ceiling next to it. Medians over the timed
// steps. Several GPUs (--device cuda:all) train data-parallel with the NCCL all-reduce, each on
// --batch sequences, and the scaling column compares them with one GPU timed just before. Without
// a usable GPU it says why and exits 0.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "common/error.h"
#include "daemon/config.h"
#include "kernels/backend.h"
#include "kernels/cuda/cuda_ops.h"
#include "engine/device_group.h"

using namespace starling;
using Clock = std::chrono::steady_clock;

namespace {

// Dense peak TFLOP/s by precision, from the vendors' data sheets (without sparsity).
struct DevicePeak {
    const char* name_part;  // matched against the CUDA device name, first match wins
    double fp32, tf32, bf16;
};

constexpr DevicePeak kPeaks[] = {
    {"H100 PCIe", 51.2, 378.0, 756.0}, {"H100 NVL", 60.0, 417.0, 835.0},
    {"H100", 66.9, 494.7, 989.4},  // SXM
    {"H200", 66.9, 494.7, 989.4},      {"GH200", 66.9, 494.7, 989.4},
    {"A100", 19.5, 156.0, 312.0},      {"L40S", 91.6, 183.0, 362.0},
};

std::optional<DevicePeak> peak_of(const std::string& device_name) {
    for (const DevicePeak& p : kPeaks) {
        if (device_name.find(p.name_part) != std::string::npos) return p;
    }
    return std::nullopt;
}

struct Precision {
    const char* name;
    cuda::MatmulMath math;
    double DevicePeak::*peak;
};

constexpr Precision kPrecisions[] = {
    {"fp32", cuda::MatmulMath::Fp32, &DevicePeak::fp32},
    {"tf32", cuda::MatmulMath::Tf32, &DevicePeak::tf32},
    {"bf16", cuda::MatmulMath::Bf16, &DevicePeak::bf16},
};

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

double seconds_since(Clock::time_point start) {
    return std::chrono::duration<double>(Clock::now() - start).count();
}

// Median TFLOP/s of one (M, K) x (N, K)^T product through the backend's own matmul.
double gemm_tflops(cuda::CudaOps& ops, int M, int N, int K, int reps) {
    float* a = ops.alloc(size_t(M) * K);
    float* b = ops.alloc(size_t(N) * K);
    float* c = ops.alloc(size_t(M) * N);
    std::vector<double> times;
    for (int r = 0; r < reps + 2; r++) {
        ops.synchronize();
        const auto start = Clock::now();
        ops.matmul_forward(c, a, b, M, K, N, false);
        ops.synchronize();
        if (r >= 2) times.push_back(seconds_since(start));
    }
    for (float* p : {a, b, c}) ops.release(p);
    return 2.0 * M * N * K / median(times) / 1e12;
}

cuda::CudaOps& gpu(const Backend& backend, size_t r) {
    return dynamic_cast<cuda::CudaOps&>(*backend.devices[r]);
}

// One precision on the GPUs `device` names, `batch` sequences on each; returns tokens/s.
double run(const TrainConfig& config, const std::string& device, const Precision& precision,
           int batch, int steps, std::optional<double> one_gpu_tokens_per_s) {
    const Backend backend = make_backend({device, 0, precision.name});
    const size_t gpus = backend.devices.size();
    const int B = batch * static_cast<int>(gpus), T = config.effective_seq_len();
    const double ceiling = gemm_tflops(gpu(backend, 0), 8192, 8192, 8192, 5);
    DeviceGroup group(backend, config.model, config.adamw, B, T);
    group.init_weights(config.seed);
    std::vector<int32_t> tokens(size_t(B) * T + 1);
    for (size_t i = 0; i < tokens.size(); i++) {
        tokens[i] = int32_t((i * 131 + 7) % size_t(config.model.vocab_size));
    }
    std::vector<double> times;
    for (int s = 0; s < steps + 3; s++) {
        const auto start = Clock::now();
        group.train_step(tokens.data(), tokens.data() + 1, 1e-4f);
        for (size_t r = 0; r < gpus; r++) gpu(backend, r).synchronize();
        if (s >= 3) times.push_back(seconds_since(start));
    }
    const double step = median(times);
    const double tokens_per_s = B * T / step;
    const double tflops = tokens_per_s * config.model.flops_per_token(T) / 1e12;
    const std::optional<DevicePeak> peak = peak_of(gpu(backend, 0).device().name);
    char mfu[32] = "unknown";
    if (peak) {
        std::snprintf(mfu, sizeof mfu, "%.1f%%",
                      100.0 * tflops / (static_cast<double>(gpus) * ((*peak).*precision.peak)));
    }
    char scaling[32] = "";
    if (one_gpu_tokens_per_s) {
        std::snprintf(scaling, sizeof scaling, "%.1f%%",
                      100.0 * tokens_per_s / (static_cast<double>(gpus) * *one_gpu_tokens_per_s));
    }
    std::printf("%-5s %4zu %9.1f ms %11.0f %9.1f %9s %14.1f %12.1f%%  %9.0f %8s\n", precision.name,
                gpus, step * 1e3, tokens_per_s, tflops, mfu, ceiling,
                100.0 * tflops / (static_cast<double>(gpus) * ceiling),
                group.peak_device_bytes() / 1048576.0, scaling);
    std::fflush(stdout);
    return tokens_per_s;
}

}  // namespace

int main(int argc, char** argv) {
    std::string config_path = std::string(STARLING_SOURCE_DIR) + "/configs/124m.toml";
    std::string device = "cuda:0";
    int steps = 20;
    std::optional<int> batch, seq;
    std::vector<std::string> maths = {"fp32", "tf32", "bf16"};
    CLI::App app{"bench_train_gpu: training throughput, MFU and memory on one GPU or several"};
    app.add_option("--config", config_path, "model and batch from this TOML")
        ->capture_default_str();
    app.add_option("--device", device, "cuda:N, cuda:N,M,... or cuda:all")->capture_default_str();
    app.add_option("--batch", batch, "sequences per step on each GPU (default: the config's)");
    app.add_option("--seq", seq, "tokens per sequence (default: the model's context)");
    app.add_option("--steps", steps, "timed steps (median reported)")->capture_default_str();
    app.add_option("--math", maths, "matmul precisions to run: fp32, tf32, bf16")
        ->capture_default_str();
    CLI11_PARSE(app, argc, argv);

    DeviceChoice choice;
    try {
        choice = parse_device(device);
    } catch (const Error& e) {
        std::fprintf(stderr, "bench_train_gpu: %s\n", e.what());
        return 1;
    }
    if (choice.kind != DeviceChoice::Kind::Cuda) {
        std::fprintf(
            stderr,
            "bench_train_gpu: --device %s names no GPU (cuda:N, cuda:N,M,... or cuda:all)\n",
            device.c_str());
        return 1;
    }
    std::string reason;
    if (cuda::cuda_device_count(&reason) == 0) {
        std::printf("bench_train_gpu: no CUDA device (%s); nothing measured\n", reason.c_str());
        return 0;
    }
    TrainConfig config = load_train_config(config_path);
    if (batch) config.batch_size = *batch;
    if (seq) config.seq_len = *seq;
    config.validate();
    const ModelConfig& m = config.model;
    std::printf(
        "%s: L%d H%d C%d F%d V%d, %.2fM parameters, batch %d x %d tokens per GPU, %.2f GFLOP "
        "per token; median of %d steps after 3 warm-up steps\n",
        config_path.c_str(), m.n_layer, m.n_head, m.d_model, m.d_ff, m.vocab_size,
        m.num_parameters() / 1e6, config.batch_size, config.effective_seq_len(),
        m.flops_per_token(config.effective_seq_len()) / 1e9, steps);
    const bool several = choice.all_gpus ? cuda::cuda_device_count() > 1 : choice.gpus.size() > 1;
    const std::string first = "cuda:" + std::to_string(choice.all_gpus ? 0 : choice.gpus.front());
    std::printf("%-5s %4s %12s %11s %9s %9s %14s %13s %10s %8s\n", "math", "gpus", "step", "tok/s",
                "TFLOP/s", "MFU", "gemm TFLOP/s", "of gemm", "peak MiB", "scaling");
    for (const std::string& name : maths) {
        const auto precision = std::find_if(std::begin(kPrecisions), std::end(kPrecisions),
                                            [&](const Precision& p) { return name == p.name; });
        if (precision == std::end(kPrecisions)) {
            std::fprintf(stderr, "bench_train_gpu: unknown --math %s (fp32, tf32 or bf16)\n",
                         name.c_str());
            return 1;
        }
        std::optional<double> one_gpu;
        if (several)
            one_gpu = run(config, first, *precision, config.batch_size, steps, std::nullopt);
        run(config, device, *precision, config.batch_size, steps, one_gpu);
    }
    std::printf(
        "device: %s; MFU is model FLOP/s over the dense peak of all the GPUs for that precision; "
        "gemm is an 8192^3 cuBLAS product on one GPU in the same precision and run; scaling is "
        "tok/s over the GPU count times one GPU's tok/s, measured just before\n",
        make_backend({device, 0, "fp32"}).description.c_str());
    return 0;
}
