// The experiment harness end to end on the KJV: short runs of every method, checked against what
// each method must do (identical replicas for DiLoCo, the same result for fused and split
// messages, the bytes the message layout implies, data-parallel training equal to one big batch).
#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>
#include <fstream>

#include "codec/sparse.h"
#include "common/error.h"
#include "experiment/experiment.h"
#include "engine/replica.h"
#include "kernels/cpu/cpu_ops.h"
#include "model/manifest.h"
#include "tests/support/config_keys.h"
#include "tests/support/files.h"
#include "tests/support/kjv.h"

using namespace starling;
using namespace starling::test;
namespace fs = std::filesystem;

namespace {

const std::string kSwarmConfig =
    std::string(STARLING_SOURCE_DIR) + "/configs/experiments/swarm.toml";

// The study's config, shrunk: 4 replicas, 4 rounds of 10 steps, 2 validation batches.
ExperimentConfig small(const std::string& name, OuterMethod method) {
    ExperimentConfig c = load_experiment_config(kSwarmConfig);
    c.train.data.dir = kjv_dir();
    c.train.threads = 2;
    c.train.steps = 40;
    c.train.schedule.warmup_steps = 10;
    c.train.eval_batches = 2;
    c.replicas = 4;
    c.inner_steps = 10;
    c.method = method;
    c.out_dir = (scratch_root() / "runs").string();
    c.name = name;
    return c;
}

// Bytes of one message: the 64-byte header, then per chunk a 48-byte header and the payload.
// Every segment of these small models fits in one chunk.
size_t message_bytes(const std::vector<std::pair<size_t, size_t>>& segments_bytes) {
    size_t total = 64;
    for (const auto& [count, bytes] : segments_bytes) total += 48 + count * bytes;
    return total;
}

std::vector<std::string> read_lines(const fs::path& path) {
    std::ifstream in(path);
    std::vector<std::string> lines;
    for (std::string line; std::getline(in, line);) lines.push_back(line);
    return lines;
}

}  // namespace

TEST_CASE("experiment: DiLoCo keeps every replica on the same bits and sends Q8 deltas") {
    ExperimentConfig c = small("diloco", OuterMethod::DiLoCo);
    c.outer = {0.9f, 0.7f, 0.7f, MomentumForm::Nesterov};
    c.exchange.delta_codec = codec::Codec::Q8;
    c.exchange.zstd = false;
    const ExperimentSummary s = run_experiment(c);
    CHECK(s.final_spread == 0.0);
    CHECK(s.final_loss_min == s.final_loss_max);
    CHECK(s.final_loss_mean < 3.5);  // from about 5.5 at initialisation
    // All-gather: each replica sends its Q8 message (1 byte per value, a 4-byte scale per 64) to
    // the 3 others.
    const size_t n = s.params;
    const size_t q8 = n + (n + 63) / 64 * 4;
    CHECK(s.sent_per_round == Approx(3.0 * (64 + 48 + q8)).epsilon(1e-12));
    CHECK(s.received_per_round == s.sent_per_round);
    CHECK(s.paired == 16);
    CHECK(s.solo == 0);

    const std::vector<std::string> lines = read_lines(fs::path(c.out_dir) / "diloco.csv");
    REQUIRE(lines.size() == 1 + 5 * 4);  // header, then rounds 0-4 for 4 replicas
    CHECK(lines[0].rfind("round,inner_step,replica,node_id,live,group,val_loss", 0) == 0);
}

TEST_CASE("experiment: DiLoCo with TOPK deltas keeps every replica on the same bits") {
    ExperimentConfig c = small("diloco-topk", OuterMethod::DiLoCo);
    c.outer = {0.9f, 0.7f, 0.7f, MomentumForm::Nesterov};
    c.exchange.delta_codec = codec::Codec::TOPK;
    c.exchange.topk_chunk = 1024;
    c.exchange.topk_density = 0.03;  // 31 of every 1024 values
    c.exchange.zstd = false;
    const ExperimentSummary s = run_experiment(c);
    // Each replica decodes its own message as the others do, so all hold the same phi.
    CHECK(s.final_spread == 0.0);
    CHECK(s.final_loss_min == s.final_loss_max);
    CHECK(std::isfinite(s.final_loss_mean));
    CHECK(s.final_loss_mean < 5.0);  // from about 5.5 at initialisation
    // All-gather to the 3 others of the message TOPK's layout gives (codec/README.md).
    const size_t n = s.params;
    const size_t payload = codec::sparse_encoded_bytes(c.exchange.topk_format(), n);
    CHECK(s.sent_per_round == Approx(3.0 * (64 + 48 + payload)).epsilon(1e-12));
    CHECK(s.sent_per_round / 3.0 / static_cast<double>(n) < 0.1);
}

TEST_CASE(
    "experiment: only DiLoCo with TOPK keeps its residual in the weights, and long rounds warn") {
    ExperimentConfig c = small("where", OuterMethod::DiLoCo);
    c.exchange.delta_codec = codec::Codec::TOPK;
    c.inner_steps = kMaxSparseInnerSteps;
    CHECK(c.residual_in_weights());
    CHECK(c.delta_feedback_decay() == 0.0f);  // the message carries D alone
    CHECK(c.settings_warning().empty());
    c.inner_steps = 50;
    CHECK_THAT(c.settings_warning(), Catch::Contains("TOPK deltas in DiLoCo rounds of 50 inner"));
    c.exchange.residual_in_weights = false;
    CHECK_FALSE(c.residual_in_weights());
    CHECK(c.delta_feedback_decay() == Approx(0.95));
    c.exchange.residual_in_weights = true;
    c.exchange.error_feedback = false;
    CHECK_FALSE(c.residual_in_weights());  // no residual to keep
    c = small("q8", OuterMethod::DiLoCo);
    c.inner_steps = 50;
    CHECK_FALSE(c.residual_in_weights());
    CHECK(c.delta_feedback_decay() == 1.0f);
    CHECK(c.settings_warning().empty());
    c = small("split", OuterMethod::NoLoCo);
    c.exchange.mode = MessageMode::Split;
    c.exchange.delta_codec = codec::Codec::TOPK;
    c.inner_steps = 50;
    // In the messages: in split NoLoCo the weights' form ended 17% behind (docs/compression.md).
    CHECK_FALSE(c.residual_in_weights());
    CHECK(c.delta_feedback_decay() == Approx(0.95));
    CHECK(c.settings_warning().empty());
}

TEST_CASE("experiment: NoLoCo fused and split messages give the same replicas with F32") {
    // Three replicas: one pair and one solo replica every round, so both kinds of step compare.
    ExperimentConfig fused = small("fused", OuterMethod::NoLoCo);
    fused.replicas = 3;
    fused.exchange.mode = MessageMode::Fused;
    fused.exchange.state_codec = codec::Codec::F32;
    ExperimentConfig split = small("split", OuterMethod::NoLoCo);
    split.replicas = 3;
    split.exchange.mode = MessageMode::Split;
    split.exchange.state_codec = codec::Codec::F32;
    split.exchange.delta_codec = codec::Codec::F32;
    split.exchange.error_feedback = false;
    fused.exchange.zstd = split.exchange.zstd = false;
    fused.exchange.update_sample = 0;  // theta alone, for the bytes below
    const ExperimentSummary a = run_experiment(fused);
    const ExperimentSummary b = run_experiment(split);
    CHECK(a.final_loss_mean == Approx(b.final_loss_mean).epsilon(1e-5));
    CHECK(a.averaged_phi_loss == Approx(b.averaged_phi_loss).epsilon(1e-5));
    CHECK(a.final_spread == Approx(b.final_spread).epsilon(1e-3));
    CHECK(a.final_spread > 0.0);  // pairs differ: this is not DiLoCo
    CHECK(a.paired == 8);         // 4 rounds of one pair
    CHECK(a.solo == 4);
    // Split sends twice what fused does: D and phi instead of theta.
    CHECK(b.sent_per_round == Approx(2.0 * a.sent_per_round).epsilon(1e-12));

    // Phi every other round: rounds 0 and 2 send D and phi, 1 and 3 D alone, and take no pull.
    split.exchange.phi_every = 2;
    split.name = "split-phi-every-2";
    const ExperimentSummary c = run_experiment(split);
    CHECK(c.sent_per_round == Approx(1.5 * a.sent_per_round).epsilon(1e-12));
    CHECK(c.paired == 8);
    CHECK(c.final_loss_mean != b.final_loss_mean);
    CHECK(c.final_loss_mean == Approx(b.final_loss_mean).epsilon(0.02));
}

TEST_CASE("experiment: a state message costs what its layout says") {
    ExperimentConfig c = small("bytes", OuterMethod::NoLoCo);
    c.exchange.state_codec = codec::Codec::BF16SR;
    c.exchange.zstd = false;
    c.exchange.update_sample = 8192;
    const ExperimentSummary s = run_experiment(c);
    // 1-D tensors and tensors under 4096 values go as F32, the rest as bf16; neighbouring tensors
    // with the same codec share a segment.
    const ParameterManifest manifest(c.train.model);
    std::vector<std::pair<size_t, size_t>> segments;
    for (const TensorInfo& t : manifest.tensors()) {
        const size_t bytes = (t.shape.size() == 1 || t.numel < 4096) ? 4 : 2;
        if (!segments.empty() && segments.back().second == bytes) {
            segments.back().first += t.numel;
        } else {
            segments.push_back({t.numel, bytes});
        }
    }
    // Beside theta, theta and phi at 8192 coordinates: a header and one chunk of F32 values.
    const double sample_bytes = 64 + 48 + 2 * 4 * 8192;
    CHECK(s.sent_per_round == Approx(message_bytes(segments) + sample_bytes).epsilon(1e-12));
    // docs/spec.md section 5's estimate for fused bf16 messages: about 2 bytes per parameter.
    CHECK((s.sent_per_round - sample_bytes) / static_cast<double>(s.params) ==
          Approx(2.0).epsilon(0.01));
}

TEST_CASE("experiment: local-only replicas never send and drift apart") {
    const ExperimentSummary s = run_experiment(small("local", OuterMethod::Local));
    CHECK(s.sent_per_round == 0.0);
    CHECK(s.received_per_round == 0.0);
    CHECK(s.final_spread > 0.0);
    CHECK(s.final_loss_min < s.final_loss_max);
    CHECK(s.solo == 16);
}

TEST_CASE("experiment: under churn replicas leave, come back from a sponsor and training goes on") {
    ExperimentConfig c = small("churn", OuterMethod::NoLoCo);
    c.train.steps = 80;
    c.churn.enabled = true;
    c.churn.mean_up_steps = 15;
    c.churn.down_steps = 10;
    const ExperimentSummary s = run_experiment(c);
    CHECK(s.rejoins > 0);
    CHECK(s.paired + s.solo < 8u * 4u);  // some replica-rounds were spent down
    CHECK(s.tokens < uint64_t(80) * 4 * 16 * 64);
    CHECK(s.final_loss_mean < 3.5);
    // A rejoin fetches phi, outer momentum and AdamW m and v: 16 bytes per parameter.
    const std::vector<std::string> lines = read_lines(fs::path(c.out_dir) / "churn.csv");
    bool snapshot_seen = false;
    for (const std::string& line : lines) {
        snapshot_seen |= line.find(',' + std::to_string(16 * s.params) + ',') != std::string::npos;
    }
    CHECK(snapshot_seen);
}

TEST_CASE("experiment: data-parallel steps equal one model trained on the concatenated batch") {
    ExperimentConfig c = small("ddp", OuterMethod::Ddp);
    c.replicas = 3;
    const Backend backend = make_backend({"cpu", 0, "fp32"});
    Ops<float>& ops = backend.lead();
    std::vector<std::unique_ptr<DataLoader>> streams;
    for (int i = 0; i < c.replicas; i++)
        streams.push_back(make_train_loader(c.train, c.replicas, i, 100 + i));
    Replica replica(c.train, c.replicas, backend, 0, 100);
    const LrSchedule schedule = c.train.lr_schedule();
    replica.averaged_gradient_phase(2, schedule, streams);

    // The reference: one model with a batch of all three streams' sequences.
    const int B = c.train.batch_size, T = c.train.effective_seq_len();
    Model<float> big(c.train.model, ops, 3 * B, T);
    big.init_weights(c.train.seed);
    AdamW<float> adamw(ops, big.manifest(), c.train.adamw);
    std::vector<int32_t> inputs(size_t(3) * B * T), targets(inputs.size());
    for (int i = 0; i < c.replicas; i++)
        streams[i] = make_train_loader(c.train, c.replicas, i, 100 + i);
    for (int step = 0; step < 2; step++) {
        for (int i = 0; i < c.replicas; i++) {
            const size_t at = size_t(i) * B * T;
            streams[i]->next_batch(inputs.data() + at, targets.data() + at);
        }
        big.forward(inputs.data(), targets.data());
        big.zero_grad();
        big.backward();
        adamw.step(big.params(), big.grads(), schedule.lr_at(step));
    }
    double max_diff = 0.0;
    for (size_t k = 0; k < replica.size(); k++) {
        max_diff = std::max(max_diff, double(std::fabs(replica.theta()[k] - big.params()[k])));
    }
    CHECK(max_diff < 1e-5);
}

TEST_CASE(
    "experiment: overlapped rounds land the outer step late, send the same bytes and still train") {
    // Without zstd the bytes are the layout's alone, so both schedules must send exactly as many.
    ExperimentConfig base = small("sequential", OuterMethod::NoLoCo);
    base.exchange.zstd = false;
    const ExperimentSummary sequential = run_experiment(base);
    for (int late : {5, 10}) {  // half an inner phase late, and a whole one
        INFO("overlap_steps " << late);
        ExperimentConfig c = base;
        c.name = "overlap" + std::to_string(late);
        c.overlap_steps = late;
        const ExperimentSummary overlapped = run_experiment(c);
        CHECK(overlapped.sent_per_round ==
              sequential.sent_per_round);  // the messages are the same size
        CHECK(overlapped.paired == sequential.paired);
        CHECK(overlapped.final_loss_mean != sequential.final_loss_mean);  // the delay is real
        CHECK(overlapped.final_loss_mean < 3.5);                          // from about 5.5
        CHECK(std::abs(overlapped.final_loss_mean - sequential.final_loss_mean) <
              0.05 * sequential.final_loss_mean);
    }
}

TEST_CASE("experiment: config mistakes are refused with the key named") {
    ExperimentConfig c = small("bad", OuterMethod::NoLoCo);
    c.outer.pull = 0.35f;
    CHECK_THROWS_WITH(c.validate(), Catch::Contains("[outer].pull"));
    c = small("bad", OuterMethod::NoLoCo);
    c.train.steps = 45;
    CHECK_THROWS_WITH(c.validate(), Catch::Contains("whole number of rounds"));
    c = small("bad", OuterMethod::NoLoCo);
    c.exchange.state_codec = codec::Codec::Q4;
    CHECK_THROWS_WITH(c.validate(), Catch::Contains("[exchange].state_codec"));
    c = small("bad", OuterMethod::NoLoCo);
    c.exchange.state_codec = codec::Codec::TOPK;
    CHECK_THROWS_WITH(c.validate(), Catch::Contains("TOPK are delta codecs"));
    c = small("bad", OuterMethod::DiLoCo);
    c.exchange.delta_codec = codec::Codec::TOPK;
    c.exchange.topk_density = 2.0;
    CHECK_THROWS_WITH(c.validate(), Catch::Contains("[exchange].topk_density must be in (0, 1]"));
    c = small("bad", OuterMethod::NoLoCo);
    c.exchange.phi_every = 4;  // fused messages are theta: there is no phi to leave out
    CHECK_THROWS_WITH(c.validate(), Catch::Contains("[exchange].phi_every above 1 needs mode"));
    c.exchange.mode = MessageMode::Split;
    c.exchange.phi_every = 0;
    CHECK_THROWS_WITH(c.validate(), Catch::Contains("[exchange].phi_every must be at least 1"));
    c = small("bad", OuterMethod::NoLoCo);
    c.overlap_steps = 11;
    CHECK_THROWS_WITH(c.validate(),
                      Catch::Contains("[experiment].overlap_steps must be in [0, inner_steps]"));
    c = small("bad", OuterMethod::Local);
    c.overlap_steps = 5;
    CHECK_THROWS_WITH(c.validate(), Catch::Contains("overlap_steps needs an outer step"));

    TempDir tmp;
    std::string text;
    {
        std::ifstream in(kSwarmConfig);
        text.assign(std::istreambuf_iterator<char>(in), {});
    }
    const std::string bad_method = [&] {
        std::string t = text;
        t.replace(t.find("method = \"noloco\""), 17, "method = \"gossip\"");
        return t;
    }();
    put(tmp.file("method.toml"), bad_method);
    CHECK_THROWS_WITH(load_experiment_config(tmp.file("method.toml").string()),
                      Catch::Contains("method") && Catch::Contains("gossip"));
    put(tmp.file("section.toml"), text + "\n[swarm]\nsize = 3\n");
    CHECK_THROWS_WITH(load_experiment_config(tmp.file("section.toml").string()),
                      Catch::Contains("unknown section [swarm]"));
}

TEST_CASE("experiment: a file of every declared key at its shown value loads as those values") {
    TempDir tmp;
    const std::vector<KeyDescription> defaults = experiment_config_keys();
    put(tmp.file("defaults.toml"), toml_of(defaults));
    check_same_values(
        experiment_config_keys(load_experiment_config(tmp.file("defaults.toml").string())),
        defaults);

    ExperimentConfig changed = small("changed", OuterMethod::DiLoCo);
    changed.replicas = 5;
    changed.overlap_steps = 3;
    changed.churn.enabled = true;
    changed.exchange.delta_codec = codec::Codec::Q4;
    const std::vector<KeyDescription> keys = experiment_config_keys(changed);
    put(tmp.file("changed.toml"), toml_of(keys));
    check_same_values(
        experiment_config_keys(load_experiment_config(tmp.file("changed.toml").string())), keys);

    std::string many = toml_of(keys);
    many.replace(many.find("replicas = 5"), 12, "replicas = 65");
    put(tmp.file("replicas.toml"), many);
    CHECK_THROWS_WITH(load_experiment_config(tmp.file("replicas.toml").string()),
                      Catch::Contains("[experiment].replicas must be in [2, 64], got 65"));
}

TEST_CASE(
    "experiment: token-budget rounds share each round's batches by speed and end with the "
    "slowest share") {
    ExperimentConfig steps = small("speeds-steps", OuterMethod::NoLoCo);
    steps.speeds = {1, 1, 3, 3};
    const ExperimentSummary by_steps = run_experiment(steps);
    // Every replica takes H = 10 steps; the round lasts as long as the slowest needs: 10 / 1.
    CHECK(by_steps.sim_time == Approx(4 * 10.0));

    ExperimentConfig tokens = steps;
    tokens.name = "speeds-tokens";
    tokens.round_budget = RoundBudget::Tokens;
    const ExperimentSummary by_tokens = run_experiment(tokens);
    // 4 x 10 batches a round, shared 1 : 1 : 3 : 3: 5, 5, 15 and 15 steps, each 5 time units.
    CHECK(by_tokens.tokens == by_steps.tokens);
    CHECK(by_tokens.sim_time == Approx(4 * 5.0));
    const std::vector<std::string> lines =
        read_lines(fs::path(tokens.out_dir) / "speeds-tokens.csv");
    REQUIRE(lines.size() == 1 + 5 * 4);  // header, then round 0 and 4 rounds of 4 replicas
    CHECK(lines[0].find(",steps,sim_time") != std::string::npos);
    for (int replica = 0; replica < 4; replica++) {
        const std::string& row = lines[1 + 4 + replica];  // round 1
        const std::string tail = row.substr(row.rfind(',', row.rfind(',') - 1) + 1);
        CHECK(tail == (replica < 2 ? "5,5.00" : "15,5.00"));
    }
    CHECK(by_tokens.paired == by_steps.paired);
    CHECK(by_tokens.final_loss_mean < 3.5);  // from about 5.5

    // Weighing the outer step by tokens is a different step from the plain mean.
    ExperimentConfig unweighted = tokens;
    unweighted.name = "speeds-unweighted";
    unweighted.token_weighting = false;
    CHECK(run_experiment(unweighted).final_loss_mean != by_tokens.final_loss_mean);
}

TEST_CASE("experiment: with equal speeds a token-budget round is the step-budget round") {
    for (const OuterMethod method : {OuterMethod::NoLoCo, OuterMethod::DiLoCo}) {
        ExperimentConfig steps = small("equal-steps", method);
        const ExperimentSummary want = run_experiment(steps);
        ExperimentConfig tokens = steps;
        tokens.name = "equal-tokens";
        tokens.round_budget = RoundBudget::Tokens;
        const ExperimentSummary got = run_experiment(tokens);
        CHECK(got.final_loss_mean == want.final_loss_mean);
        CHECK(got.averaged_phi_loss == want.averaged_phi_loss);
        CHECK(got.tokens == want.tokens);
        CHECK(got.sim_time == want.sim_time);
    }
}

TEST_CASE("experiment: speeds and round budgets that cannot work are refused") {
    ExperimentConfig c = small("bad", OuterMethod::NoLoCo);
    c.speeds = {1, 2};
    CHECK_THROWS_WITH(c.validate(), Catch::Contains("[experiment].speeds must give one speed"));
    c.speeds = {1, 2, 0, 1};
    CHECK_THROWS_WITH(c.validate(), Catch::Contains("[experiment].speeds must be above 0, got 0"));
    c = small("bad", OuterMethod::Ddp);
    c.round_budget = RoundBudget::Tokens;
    CHECK_THROWS_WITH(c.validate(), Catch::Contains("round_budget = \"tokens\""));
    c = small("bad", OuterMethod::NoLoCo);
    c.round_budget = RoundBudget::Tokens;
    c.overlap_steps = 2;
    CHECK_THROWS_WITH(c.validate(), Catch::Contains("not overlap_steps"));
}
