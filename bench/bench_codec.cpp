// Codec throughput: encode and decode of 124M fp32 values with Q8, Q4 and BF16SR on one thread
// and on two, in input bytes per second, next to memcpy bandwidth measured in the same run.
// Medians of several repetitions.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include "kernels/cpu/cpu_ops.h"
#include "common/random.h"
#include "codec/codec.h"

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

}  // namespace

int main(int argc, char** argv) {
    size_t n = 124'000'000;
    int reps = 5;
    CLI::App app{"bench_codec: codec throughput against memcpy"};
    app.add_option("-n,--values", n, "fp32 values per message")->capture_default_str();
    app.add_option("--reps", reps, "repetitions (median reported)")->capture_default_str();
    CLI11_PARSE(app, argc, argv);

    // Delta-like values: normal with a small std, so scales are realistic.
    std::vector<float> x(n), y(n), copy(n);
    for (size_t i = 0; i < n; i++) x[i] = static_cast<float>(1e-3 * normal_at(7, i));
    const double gb = static_cast<double>(n) * sizeof(float) / 1e9;

    std::printf("%zu fp32 values (%.2f GB), median of %d runs, GB/s of fp32 input\n\n", n, gb,
                reps);
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
    }
    std::printf("\nbytes per parameter on the wire (no framing, no zstd):");
    for (codec::Codec c :
         {codec::Codec::F32, codec::Codec::BF16SR, codec::Codec::Q8, codec::Codec::Q4}) {
        std::printf("  %s %.4f", std::string(codec::codec_name(c)).c_str(),
                    static_cast<double>(codec::encoded_bytes(c, n)) / n);
    }
    std::printf("\n");
    return 0;
}
