// Bytes on the wire per parameter for every message a peer may send, measured on real deltas and
// weights: a model trained on the KJV for --warmup steps gives phi, --inner more steps give theta,
// and delta = theta - phi is one round's worth of change. Each message is framed exactly as it
// travels (header, chunk headers, payloads), with and without the zstd stage.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <spdlog/spdlog.h>
#include <vector>

#include "daemon/config.h"
#include "daemon/trainer.h"
#include "codec/message.h"

using namespace starling;

namespace {

size_t message_bytes(const codec::MessagePlan& plan, const float* source, bool zstd,
                     bool feedback) {
    std::vector<float> residual(feedback ? plan.numel : 0, 0.0f);
    codec::MessageEncoder encoder(plan, codec::RoundingKey{1, 1, 0}, source,
                                  feedback ? residual.data() : nullptr, zstd,
                                  plan.codec == codec::Codec::TOPK && feedback ? 0.95f : 1.0f);
    return codec::encode_to_end(encoder).bytes();
}

}  // namespace

int main(int argc, char** argv) {
    std::string config_path = "configs/nano.toml", data_dir = "out/kjv";
    int warmup = 200, inner = 50;
    CLI::App app{"bench_wire: bytes per parameter of real messages, with and without zstd"};
    app.add_option("--config", config_path, "model to train")->capture_default_str();
    app.add_option("--data-dir", data_dir, "prepared shards (starling data prepare)")
        ->capture_default_str();
    app.add_option("--warmup", warmup, "steps before the round starts (phi)")
        ->capture_default_str();
    app.add_option("--inner", inner, "inner steps of the round (theta)")->capture_default_str();
    CLI11_PARSE(app, argc, argv);
    spdlog::set_level(spdlog::level::warn);

    TrainConfig config = load_train_config(config_path);
    config.data.dir = data_dir;
    config.resume = false;
    config.run_dir = "out/runs/bench-wire";
    config.eval_every = 0;
    config.checkpoint_every = 0;
    config.steps = warmup + inner + 1;  // never the final step, so nothing is evaluated or saved
    Trainer trainer(config);
    Model<float>& model = trainer.model();
    const size_t n = model.num_params();
    trainer.run(warmup);
    const std::vector<float> phi(model.params(), model.params() + n);
    trainer.run(inner);
    const std::vector<float> theta(model.params(), model.params() + n);
    std::vector<float> delta(n);
    for (size_t i = 0; i < n; i++) delta[i] = theta[i] - phi[i];

    std::printf("%s: %zu parameters, delta over %d inner steps after %d warm-up steps\n\n",
                config_path.c_str(), n, inner, warmup);
    std::printf("%-7s %-8s %-32s %12s %12s %8s\n", "kind", "codec", "source", "B/param",
                "zstd B/param", "ratio");
    struct Row {
        codec::PlanKind kind;
        codec::Codec codec;
        const float* source;
        bool feedback;
        const char* what;
        codec::SparseFormat sparse = {};
    };
    const Row rows[] = {
        {codec::PlanKind::Delta, codec::Codec::F32, delta.data(), false, "delta"},
        {codec::PlanKind::Delta, codec::Codec::Q8, delta.data(), false, "delta"},
        {codec::PlanKind::Delta, codec::Codec::Q4, delta.data(), true, "delta, error feedback"},
        {codec::PlanKind::Delta,
         codec::Codec::TOPK,
         delta.data(),
         true,
         "delta, EF, 0.5% 2-bit",
         {4096, 20, 2}},
        {codec::PlanKind::Delta,
         codec::Codec::TOPK,
         delta.data(),
         true,
         "delta, EF, 1.5% 2-bit",
         {4096, 61, 2}},
        {codec::PlanKind::Delta,
         codec::Codec::TOPK,
         delta.data(),
         true,
         "delta, EF, 3% 2-bit",
         {4096, 123, 2}},
        {codec::PlanKind::Delta,
         codec::Codec::TOPK,
         delta.data(),
         true,
         "delta, EF, 1.5% 4-bit",
         {4096, 61, 4}},
        {codec::PlanKind::State, codec::Codec::F32, theta.data(), false, "weights (theta)"},
        {codec::PlanKind::State, codec::Codec::BF16SR, theta.data(), false, "weights (theta)"},
        {codec::PlanKind::State, codec::Codec::Q8, theta.data(), false, "weights (theta)"},
    };
    for (const Row& r : rows) {
        const codec::MessagePlan plan =
            codec::make_plan(model.manifest(), r.kind, r.codec, r.sparse);
        const double raw =
            static_cast<double>(message_bytes(plan, r.source, false, r.feedback)) / n;
        const double packed =
            static_cast<double>(message_bytes(plan, r.source, true, r.feedback)) / n;
        std::printf("%-7s %-8s %-32s %12.4f %12.4f %7.3fx\n",
                    std::string(codec::plan_kind_name(r.kind)).c_str(),
                    std::string(codec::codec_name(r.codec)).c_str(), r.what, raw, packed,
                    raw / packed);
    }
    return 0;
}
