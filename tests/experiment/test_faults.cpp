// Faulty members for the study of robust rounds (experiment/fault.h): what a FaultyLink sends,
// checked against the values computed here by hand from the honest message (lossless F32 codecs,
// so the codec adds no error); the in-process board's quarantine; and short runs of the
// experiment with a faulty member.
#include <catch2/catch.hpp>
#include <cmath>
#include <thread>

#include "codec/codec.h"
#include "common/random.h"
#include "data/prepare.h"
#include "data/shard.h"
#include "engine/in_process_link.h"
#include "engine/member_round.h"
#include "experiment/experiment.h"
#include "experiment/experiment_config.h"
#include "experiment/fault.h"
#include "model/manifest.h"
#include "peer/partners.h"
#include "tests/support/experiment_configs.h"
#include "tests/support/files.h"

using namespace starling;
using namespace starling::test;

namespace {

constexpr uint64_t kHonest = 0x1111, kFaulty = 0x2222;

ModelConfig tiny_model() {
    ModelConfig m;
    m.n_layer = 1;
    m.n_head = 2;
    m.d_model = 16;
    m.d_ff = 32;
    m.vocab_size = 16;
    m.context = 8;
    return m;
}

EngineConfig lossless(OuterMethod method) {
    EngineConfig c;
    c.method = method;
    c.exchange.mode = MessageMode::Fused;
    c.exchange.state_codec = codec::Codec::F32;
    c.exchange.delta_codec = codec::Codec::F32;
    c.exchange.zstd = false;
    return c;
}

std::vector<float> values_of(uint64_t seed, size_t n, double scale) {
    std::vector<float> v(n);
    for (size_t i = 0; i < n; i++) v[i] = static_cast<float>(scale * normal_at(seed, i));
    return v;
}

double norm(std::span<const float> v) {
    double s = 0.0;
    for (const float x : v) s += static_cast<double>(x) * x;
    return std::sqrt(s);
}

// One member, faulty or not, and the honest member that receives what it sends.
struct Pair {
    explicit Pair(const FaultConfig& faulty, OuterMethod method = OuterMethod::DiLoCo)
        : config(lossless(method)),
          manifest(tiny_model()),
          n(manifest.total()),
          phi(values_of(7, n, 0.1)),
          plans(round_message_plans(config, manifest)),
          fault(faulty) {}

    // DiLoCo: the faulty member publishes D for `round`; what the honest one gathers, and the
    // tokens it was told.
    std::pair<std::vector<float>, uint64_t> publish_and_gather(uint64_t round, std::vector<float> d,
                                                               uint64_t tokens) {
        board.begin_round(round, {kHonest, kFaulty}, 2);
        FaultyLink faulty(board.link(kFaulty), fault, config, manifest, kFaulty, phi, memory);
        codec::MessageEncoder encoder(plans.first, {kFaulty, round, 0}, d.data(), nullptr, false);
        faulty.publish(
            round, std::make_shared<codec::EncodedMessage>(codec::encode_to_end(encoder)), tokens);
        std::vector<float> got(n);
        codec::MessageDecoder decoder(manifest.fingerprint(), manifest, got.data(), n);
        codec::MessageDecoder* decoders[] = {&decoder};
        const uint64_t members[] = {kFaulty};
        uint64_t bytes = 0;
        const auto gathered = board.link(kHonest)->gather(round, members, decoders, &bytes);
        REQUIRE(gathered[0].error.empty());
        return {got, gathered[0].tokens};
    }

    // NoLoCo round 0: the faulty member sends faulty_theta and the honest one honest_theta over
    // the board at once; what each received (honest, faulty).
    std::pair<std::vector<float>, std::vector<float>> exchange_fused(
        const std::vector<float>& faulty_theta, const std::vector<float>& honest_theta,
        PartnerMessage partner_message = {}) {
        board.begin_round(0, {kHonest, kFaulty}, 2);
        std::vector<float> at_honest(n), at_faulty(n);
        codec::MessageDecoder to_honest(manifest.fingerprint(), manifest, at_honest.data(), n);
        codec::MessageDecoder to_faulty(manifest.fingerprint(), manifest, at_faulty.data(), n);
        codec::MessageEncoder faulty_out(plans.first, {kFaulty, 0, 0}, faulty_theta.data(), nullptr,
                                         false);
        codec::MessageEncoder honest_out(plans.first, {kHonest, 0, 0}, honest_theta.data(), nullptr,
                                         false);
        std::thread faulty_side([&] {
            FaultyLink link(board.link(kFaulty), fault, config, manifest, kFaulty, phi, memory,
                            partner_message);
            std::vector<LinkPart> parts;
            parts.push_back({streamed_message(faulty_out), to_faulty});
            link.exchange(0, kHonest, std::move(parts), 0, 0);
        });
        std::vector<LinkPart> parts;
        parts.push_back({streamed_message(honest_out), to_honest});
        const auto result = board.link(kHonest)->exchange(0, kFaulty, std::move(parts), 0, 0);
        faulty_side.join();
        REQUIRE(result[0].received);
        return {at_honest, at_faulty};
    }

    EngineConfig config;
    ParameterManifest manifest;
    size_t n;
    std::vector<float> phi;
    RoundPlans plans;
    FaultConfig fault;
    FaultMemory memory;
    InProcessBoard board;
};

FaultConfig fault_of(FaultKind kind, double scale = 100.0) { return {kind, 1, scale}; }

}  // namespace

TEST_CASE("fault: a faulty link sends the update its fault makes, through the codec") {
    const size_t n = ParameterManifest(tiny_model()).total();
    const std::vector<float> d = values_of(3, n, 0.01);
    const double d_norm = norm(d);

    SECTION("scaled, sign-flipped, free-rider") {
        const auto [scaled, t1] =
            Pair(fault_of(FaultKind::Scaled, 250.0)).publish_and_gather(0, d, 9);
        const auto [flipped, t2] = Pair(fault_of(FaultKind::SignFlip)).publish_and_gather(0, d, 9);
        const auto [free, t3] = Pair(fault_of(FaultKind::FreeRider)).publish_and_gather(0, d, 9);
        for (size_t i = 0; i < n; i++) {
            REQUIRE(scaled[i] == static_cast<float>(d[i] * 250.0));
            REQUIRE(flipped[i] == -d[i]);
            REQUIRE(free[i] == 0.0f);
        }
        CHECK(t1 == 9);  // message faults leave the tokens as said
    }
    SECTION("non-finite: NaN where the codec carries fp32") {
        const auto [got, tokens] = Pair(fault_of(FaultKind::NonFinite)).publish_and_gather(0, d, 9);
        for (const float v : got) REQUIRE(std::isnan(v));
    }
    SECTION("noise of the update's norm, another each round") {
        Pair pair(fault_of(FaultKind::Noise));
        const auto [first, t1] = pair.publish_and_gather(0, d, 9);
        const auto [second, t2] = pair.publish_and_gather(1, d, 9);
        CHECK(norm(first) == Approx(d_norm).epsilon(1e-5));
        CHECK(norm(second) == Approx(d_norm).epsilon(1e-5));
        double dot = 0.0, dot_rounds = 0.0;
        for (size_t i = 0; i < n; i++) {
            dot += static_cast<double>(first[i]) * d[i];
            dot_rounds += static_cast<double>(first[i]) * second[i];
        }
        // Independent of the update and of each other: far from parallel at this size.
        CHECK(std::abs(dot) / (d_norm * d_norm) < 0.2);
        CHECK(std::abs(dot_rounds) / (d_norm * d_norm) < 0.2);
    }
    SECTION("bias: scale times the update's norm, one direction in every round") {
        Pair pair(fault_of(FaultKind::Bias, 0.5));
        const std::vector<float> d2 = values_of(4, n, 0.02);
        const auto [first, t1] = pair.publish_and_gather(0, d, 9);
        const auto [second, t2] = pair.publish_and_gather(1, d2, 9);
        std::vector<double> b1(n), b2(n);
        double n1 = 0.0, n2 = 0.0, dot = 0.0;
        for (size_t i = 0; i < n; i++) {
            b1[i] = first[i] - static_cast<double>(d[i]);
            b2[i] = second[i] - static_cast<double>(d2[i]);
            n1 += b1[i] * b1[i];
            n2 += b2[i] * b2[i];
            dot += b1[i] * b2[i];
        }
        CHECK(std::sqrt(n1) == Approx(0.5 * d_norm).epsilon(1e-4));
        CHECK(std::sqrt(n2) == Approx(0.5 * norm(d2)).epsilon(1e-4));
        CHECK(dot / std::sqrt(n1 * n2) == Approx(1.0).epsilon(1e-4));
    }
    SECTION("replay: the round before's update, its own in the first round") {
        Pair pair(fault_of(FaultKind::Replay));
        const std::vector<float> d2 = values_of(4, n, 0.02);
        const auto [first, t1] = pair.publish_and_gather(0, d, 9);
        const auto [second, t2] = pair.publish_and_gather(1, d2, 9);
        CHECK(first == d);
        CHECK(second == d);
    }
    SECTION("tokens: the claim times the scale, the values as trained") {
        const auto [got, tokens] =
            Pair(fault_of(FaultKind::Tokens, 1000.0)).publish_and_gather(0, d, 9);
        CHECK(tokens == 9000);
        CHECK(got == d);
    }
}

TEST_CASE("fault: a fused message is phi plus the altered update") {
    Pair pair(fault_of(FaultKind::Scaled, 10.0), OuterMethod::NoLoCo);
    const size_t n = pair.n;
    std::vector<float> theta = pair.phi;
    const std::vector<float> d = values_of(3, n, 0.01);
    for (size_t i = 0; i < n; i++) theta[i] += d[i];
    const std::vector<float> honest_theta = values_of(5, n, 0.1);
    const auto [at_honest, at_faulty] = pair.exchange_fused(theta, honest_theta);
    CHECK(at_faulty == honest_theta);  // what the faulty member receives is untouched
    for (size_t i = 0; i < n; i++) {
        const double expected = pair.phi[i] + 10.0 * (static_cast<double>(theta[i]) - pair.phi[i]);
        REQUIRE(at_honest[i] == Approx(expected).margin(1e-6));
    }
}

TEST_CASE("fault: an echo sends its partner's own message back as its own") {
    Pair pair(fault_of(FaultKind::Echo), OuterMethod::NoLoCo);
    const std::vector<float> honest_theta = values_of(5, pair.n, 0.1);
    const auto [at_honest, at_faulty] =
        pair.exchange_fused(values_of(3, pair.n, 0.1), honest_theta,
                            [&](uint64_t round, uint64_t partner, uint32_t part) {
                                return pair.board.sent(round, partner, kFaulty, part);
                            });
    CHECK(at_faulty == honest_theta);
    CHECK(at_honest == honest_theta);  // its own values, nothing of the echo's
}

TEST_CASE("fault: garbage data is uniform tokens, as many as the real train shards hold") {
    TempDir dir;
    ExperimentConfig c = one_node_experiment();
    const FaultConfig fault = fault_of(FaultKind::GarbageData);
    const std::string garbage = (dir.path() / "garbage").string();
    write_garbage_data(c.train, garbage);
    size_t real = 0;
    for (const std::string& path : list_shards(c.train.data.dir, "train"))
        real += Shard(path).size();
    const std::vector<std::string> shards = list_shards(garbage, "train");
    REQUIRE(shards.size() == 1);
    REQUIRE(list_shards(garbage, "val").size() == 1);  // its evaluator reads garbage too
    const Shard shard(shards[0]);
    REQUIRE(shard.size() == real);
    const int vocab = c.train.model.vocab_size;
    std::vector<size_t> counts(static_cast<size_t>(vocab));
    for (const uint16_t t : shard.tokens()) {
        REQUIRE(t < vocab);
        counts[t]++;
    }
    // Every token about equally often: within 10% of the mean, where the KJV's bytes are
    // mostly letters and never most of the 256.
    const double mean = static_cast<double>(real) / vocab;
    for (const size_t count : counts) CHECK(std::abs(count - mean) < 0.1 * mean);
    // The faulty replica reads it; the honest config is left alone.
    CHECK(faulty_train_config(fault, c.train, garbage).data.dir == garbage);
    CHECK(faulty_train_config(fault_of(FaultKind::Scaled), c.train, garbage).data.dir ==
          c.train.data.dir);
    // It passes the check a replica's loader makes of the shards' tokenizer.
    CHECK_NOTHROW(check_shards_tokenizer(garbage, c.train.data.tokenizer));
}

TEST_CASE("fault: the in-process board keeps a member apart from one that quarantined it") {
    const std::vector<uint64_t> members{11, 22, 33, 44};
    InProcessBoard board;
    // Round r's groups, from the same matching the board uses, less a pair kept apart.
    const auto expected_partners = [&](uint64_t round, uint64_t member, bool apart) {
        std::vector<uint64_t> partners;
        for (const auto& group : deterministic_groups(round, members, 2))
            if (std::find(group.begin(), group.end(), member) != group.end())
                for (const uint64_t other : group)
                    if (other != member && !(apart && (member * other == 11 * 22)))
                        partners.push_back(other);
        return partners;
    };
    board.begin_round(0, members, 2);
    board.link(11)->judged(22, 0, std::string("too far"));
    board.link(33)->judged(44, 0, std::nullopt);
    board.begin_round(1, members, 2);
    board.link(11)->judged(22, 1, std::string("too far"));  // the second in a row
    const auto judgements = board.take_judgements();
    REQUIRE(judgements.size() == 3);
    CHECK((judgements[0].refused && !judgements[0].quarantined));
    CHECK((!judgements[1].refused && judgements[1].judge == 33 && judgements[1].member == 44));
    CHECK((judgements[2].refused && judgements[2].quarantined && judgements[2].round == 1));
    CHECK(board.take_judgements().empty());
    // Quarantined for 8 rounds from round 2: neither is grouped with the other, both ways.
    for (uint64_t round = 2; round < 12; round++) {
        board.begin_round(round, members, 2);
        const bool apart = round < 10;
        for (const uint64_t m : members)
            CHECK(board.link(m)->partners(round) == expected_partners(round, m, apart));
    }
}

namespace {

ExperimentConfig small_faulty(const std::string& name, OuterMethod method, FaultKind kind,
                              double scale) {
    ExperimentConfig c = one_node_experiment();
    c.train.steps = 60;
    c.train.schedule.warmup_steps = 10;
    c.train.eval_batches = 2;
    c.replicas = 4;
    c.inner_steps = 10;
    c.method = method;
    c.fault = {kind, 1, scale};
    c.out_dir = (scratch_root() / "faults").string();
    c.name = name;
    return c;
}

}  // namespace

TEST_CASE(
    "fault: a member sending scaled updates is refused and quarantined, honest ones are not") {
    const ExperimentSummary s =
        run_experiment(small_faulty("scaled", OuterMethod::NoLoCo, FaultKind::Scaled, 1000.0));
    CHECK(s.poisoned_judged > 0);
    CHECK(s.poisoned_refused == s.poisoned_judged);
    CHECK(s.honest_judged > 0);
    CHECK(s.honest_refused == 0);
    CHECK(s.first_quarantine_round >= 1);  // the second refusal in a row
    CHECK(std::isfinite(s.honest_loss_mean));
}

TEST_CASE("fault: DiLoCo's honest members agree on their bits beside a faulty one") {
    // The run checks after every round that the honest replicas hold the same phi and momentum.
    const ExperimentSummary s =
        run_experiment(small_faulty("diloco-flip", OuterMethod::DiLoCo, FaultKind::SignFlip, 1.0));
    CHECK(std::isfinite(s.honest_loss_mean));
    CHECK(s.final_loss_max > s.final_loss_min);  // the faulty replica stepped apart
}

TEST_CASE("fault: two echoing members paired together send their own, and the run ends") {
    // An echo waits for its partner's message first; two echoes answer each other honestly
    // instead of waiting for each other forever.
    ExperimentConfig c = small_faulty("echo-two", OuterMethod::NoLoCo, FaultKind::Echo, 1.0);
    c.fault.members = 2;
    const ExperimentSummary s = run_experiment(c);
    CHECK(std::isfinite(s.honest_loss_mean));
    CHECK(s.poisoned_judged > 0);
}

TEST_CASE("fault: fault settings that cannot work are refused with the key named") {
    ExperimentConfig all = small_faulty("all", OuterMethod::NoLoCo, FaultKind::Noise, 1.0);
    all.fault.members = 4;
    CHECK_THROWS_WITH(all.validate(), Catch::Contains("[fault].members"));
    ExperimentConfig local = small_faulty("local", OuterMethod::Local, FaultKind::Scaled, 10.0);
    CHECK_THROWS_WITH(local.validate(), Catch::Contains("[fault].kind"));
    ExperimentConfig typo =
        small_faulty("typo", OuterMethod::Local, FaultKind::LearningRate, 100.0);
    CHECK_NOTHROW(typo.validate());  // a config fault needs no exchange
    CHECK_THROWS_WITH(fault_kind_from_name("flipped"), Catch::Contains("sign_flip"));
    ExperimentConfig echo = small_faulty("echo", OuterMethod::DiLoCo, FaultKind::Echo, 1.0);
    CHECK_THROWS_WITH(echo.validate(), Catch::Contains("method noloco"));
}
