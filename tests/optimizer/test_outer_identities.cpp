// U1, U2, U3 and U5 of docs/spec.md section 8 on the real engine: a tiny Llama
// (tests/support/model_configs.h) on CpuOps<float>, each replica training on its own random token
// batches, with plain SGD inner steps (theta -= lr * g) so nothing but the outer step is in play.
// Messages go through the real framing (encode_message / decode_message).
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <span>
#include <vector>

#include "kernels/cpu/cpu_ops.h"
#include "model/model.h"
#include "codec/message.h"
#include "optimizer/outer.h"
#include "tests/support/determinism.h"
#include "tests/support/model_configs.h"
#include "tests/support/outer.h"
#include "tests/support/random.h"

using namespace starling;
using namespace starling::codec;
using starling::test::as_double;
using starling::test::max_rel_diff;
using starling::test::mean_of;
using starling::test::minus;

namespace {

using Arena = std::vector<float>;

constexpr int kBatch = 2;
constexpr int kSeqLen = 6;

// One model shared by every simulated replica: a step loads the replica's theta into the model,
// takes the gradient on the replica's own batch and writes the update back. It runs on one thread:
// the model is too small to gain from two, and while another process keeps a core busy each of
// the many OpenMP regions of a forward and backward pass can wait milliseconds for one.
class Engine {
public:
    Engine() : threads_(1), model_(test::tiny_model_config(), ops_, kBatch, kSeqLen) {}

    size_t size() const { return model_.num_params(); }
    const ParameterManifest& manifest() const { return model_.manifest(); }

    Arena init(uint64_t seed) {
        model_.init_weights(seed);
        Arena theta(size());
        ops_.to_host(theta.data(), model_.params(), size());
        return theta;
    }

    // The loss gradient at theta on batch `step` of replica `replica`'s token stream (random
    // tokens from a generator seeded by both, so every replica sees different data).
    Arena gradient(const Arena& theta, uint64_t replica, uint64_t step) {
        std::mt19937_64 gen(replica * 1'000'003 + step);
        const int vocab = model_.config().vocab_size;
        std::vector<int32_t> inputs(kBatch * kSeqLen), targets(kBatch * kSeqLen);
        for (int32_t& t : inputs) t = static_cast<int32_t>(gen() % uint64_t(vocab));
        for (int32_t& t : targets) t = static_cast<int32_t>(gen() % uint64_t(vocab));
        ops_.from_host(model_.params(), theta.data(), size());
        model_.forward(inputs.data(), targets.data());
        model_.zero_grad();
        model_.backward();
        Arena g(size());
        ops_.to_host(g.data(), model_.grads(), size());
        return g;
    }

    // Inner steps first_step .. first_step + steps - 1 of plain SGD.
    void sgd(Arena& theta, uint64_t replica, uint64_t first_step, int steps, float lr) {
        for (int h = 0; h < steps; h++) {
            const Arena g = gradient(theta, replica, first_step + uint64_t(h));
            for (size_t i = 0; i < size(); i++) theta[i] -= lr * g[i];
        }
    }

private:
    test::ScopedCpuThreads threads_;
    CpuOps<float> ops_;
    Model<float> model_;
};

// What a peer receives: the message encoded from source and decoded on the other side.
Arena transmit(const ParameterManifest& manifest, PlanKind kind, Codec codec,
               const RoundingKey& key, const Arena& source) {
    const MessagePlan plan = make_plan(manifest, kind, codec);
    const auto parts = encode_message(plan, key, source.data(), nullptr, false);
    Arena out(source.size());
    decode_message(parts, manifest.fingerprint(), manifest, out.data(), out.size());
    return out;
}

bool same_bits(const Arena& a, const Arena& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace

TEST_CASE("U1: NoLoCo with one fixed pair from one start is heavy-ball DiLoCo") {
    Engine engine;
    const int rounds = 3, inner = 3;
    const float inner_lr = 0.5f;
    const double alpha = 0.5, beta = 0.7;
    const OuterConfig config{float(alpha), float(beta), float(beta), MomentumForm::HeavyBall};

    const Arena start = engine.init(1);
    std::vector<Arena> phi(2, start), delta(2, Arena(engine.size(), 0.0f));
    // Heavy-ball DiLoCo in double, its own loop: m = alpha m + beta mean(theta - phi); phi += m.
    std::vector<double> phi_ref = as_double(start), m(engine.size(), 0.0);
    for (int r = 0; r < rounds; r++) {
        CAPTURE(r);
        const uint64_t first_step = uint64_t(r) * inner;
        std::vector<Arena> theta = phi;
        for (uint64_t i = 0; i < 2; i++) engine.sgd(theta[i], i, first_step, inner, inner_lr);
        // Fused NoLoCo: each replica averages its own theta with its partner's, own first.
        const Arena mean_0 = mean_of({theta[0], theta[1]});
        const Arena mean_1 = mean_of({theta[1], theta[0]});
        outer_step_towards(config, phi[0], delta[0], mean_0);
        outer_step_towards(config, phi[1], delta[1], mean_1);

        const Arena shared(phi_ref.begin(), phi_ref.end());
        std::vector<Arena> theta_ref(2, shared);
        for (uint64_t i = 0; i < 2; i++) engine.sgd(theta_ref[i], i, first_step, inner, inner_lr);
        double largest_move = 0.0;
        for (size_t k = 0; k < engine.size(); k++) {
            const double mean_d = 0.5 * ((double(theta_ref[0][k]) - phi_ref[k]) +
                                         (double(theta_ref[1][k]) - phi_ref[k]));
            m[k] = alpha * m[k] + beta * mean_d;
            phi_ref[k] += m[k];
            largest_move = std::max(largest_move, std::abs(m[k]));
        }
        // The step is large against the tolerance, so a wrong term cannot hide in it.
        REQUIRE(largest_move > 1e-2);
        CHECK(same_bits(phi[0], phi[1]));
        CHECK(same_bits(delta[0], delta[1]));
        CHECK(max_rel_diff(phi[0], phi_ref) < 2e-6);
        CHECK(max_rel_diff(delta[0], m) < 1e-5);
    }
}

TEST_CASE("U2: DiLoCo with one inner step, outer lr 1 and no momentum is data-parallel SGD") {
    const MomentumForm form = GENERATE(MomentumForm::HeavyBall, MomentumForm::Nesterov);
    CAPTURE(momentum_form_name(form));
    Engine engine;
    const uint64_t replicas = 3;
    const float inner_lr = 0.5f;
    const OuterConfig config{0.0f, 1.0f, 0.0f, form};

    Arena phi = engine.init(2), delta(engine.size(), 0.0f);
    // Synchronous data parallelism in double: the replicas' gradients at the shared weights are
    // averaged and one SGD step is taken.
    std::vector<double> phi_ref = as_double(phi);
    for (uint64_t step = 0; step < 4; step++) {
        CAPTURE(step);
        std::vector<Arena> displacement;
        for (uint64_t i = 0; i < replicas; i++) {
            Arena theta = phi;
            engine.sgd(theta, i, step, 1, inner_lr);
            displacement.push_back(minus(theta, phi));
        }
        outer_step(config, phi, delta, mean_of({displacement[0], displacement[1], displacement[2]}),
                   {});

        const Arena at(phi_ref.begin(), phi_ref.end());
        std::vector<double> mean_g(engine.size(), 0.0);
        for (uint64_t i = 0; i < replicas; i++) {
            const Arena g = engine.gradient(at, i, step);
            for (size_t k = 0; k < g.size(); k++) mean_g[k] += double(g[k]) / double(replicas);
        }
        for (size_t k = 0; k < phi_ref.size(); k++) phi_ref[k] -= double(inner_lr) * mean_g[k];
        CHECK(max_rel_diff(phi, phi_ref) < 2e-6);
    }
}

TEST_CASE("U3: fused and split NoLoCo messages in F32 give the same phi") {
    Engine engine;
    const ParameterManifest& manifest = engine.manifest();
    const int rounds = 4, inner = 3;
    const float inner_lr = 0.5f;
    const OuterConfig config{0.5f, 0.7f, 0.7f, MomentumForm::HeavyBall};
    const uint64_t node_id[2] = {0x51, 0xa7};

    // Different starts, so the pull towards the pair's mean phi does real work.
    const std::vector<Arena> start = {engine.init(3), engine.init(4)};
    std::vector<Arena> fused_phi = start, split_phi = start;
    std::vector<Arena> fused_delta(2, Arena(engine.size(), 0.0f)), split_delta = fused_delta;
    for (int r = 0; r < rounds; r++) {
        CAPTURE(r);
        const uint64_t first_step = uint64_t(r) * inner;
        std::vector<Arena> fused_theta = fused_phi, split_theta = split_phi;
        std::vector<Arena> displacement(2), sent_theta(2), sent_d(2), sent_phi(2);
        for (uint64_t i = 0; i < 2; i++) {
            engine.sgd(fused_theta[i], i, first_step, inner, inner_lr);
            engine.sgd(split_theta[i], i, first_step, inner, inner_lr);
            displacement[i] = minus(split_theta[i], split_phi[i]);
            const RoundingKey key{node_id[i], uint64_t(r), 0};
            sent_theta[i] = transmit(manifest, PlanKind::State, Codec::F32, key, fused_theta[i]);
            sent_d[i] = transmit(manifest, PlanKind::Delta, Codec::F32, key, displacement[i]);
            sent_phi[i] = transmit(manifest, PlanKind::State, Codec::F32,
                                   RoundingKey{node_id[i], uint64_t(r), 1}, split_phi[i]);
        }
        // Own values exact, the partner's as decoded; every mean before any phi moves.
        std::vector<Arena> mean_theta(2), mean_d(2), mean_phi(2);
        for (size_t i = 0; i < 2; i++) {
            const size_t j = 1 - i;
            mean_theta[i] = mean_of({fused_theta[i], sent_theta[j]});
            mean_d[i] = mean_of({displacement[i], sent_d[j]});
            mean_phi[i] = mean_of({split_phi[i], sent_phi[j]});
        }
        for (size_t i = 0; i < 2; i++) {
            outer_step_towards(config, fused_phi[i], fused_delta[i], mean_theta[i]);
            outer_step(config, split_phi[i], split_delta[i], mean_d[i], mean_phi[i]);
        }
        for (size_t i = 0; i < 2; i++) {
            CAPTURE(i);
            CHECK(max_rel_diff(fused_phi[i], as_double(split_phi[i])) < 1e-6);
        }
        // The replicas stay far apart against that tolerance: the pull term is being tested.
        CHECK(max_rel_diff(fused_phi[0], as_double(fused_phi[1])) > 1e-3);
    }
}

TEST_CASE("U5: DiLoCo with Q8 messages and error feedback keeps every replica bit-identical") {
    Engine engine;
    const ParameterManifest& manifest = engine.manifest();
    const size_t replicas = 3;
    const int rounds = 4, inner = 2;
    const float inner_lr = 0.5f;
    const OuterConfig config{0.9f, 0.7f, 0.7f, MomentumForm::Nesterov};
    const uint64_t node_id[replicas] = {0x1001, 0x2002, 0x3003};  // the quorum in id order
    const MessagePlan plan = make_plan(manifest, PlanKind::Delta, Codec::Q8);

    std::vector<Arena> phi(replicas, engine.init(5));
    std::vector<Arena> delta(replicas, Arena(engine.size(), 0.0f));
    std::vector<Arena> residual = delta;
    for (int r = 0; r < rounds; r++) {
        CAPTURE(r);
        std::vector<std::vector<std::vector<std::byte>>> messages;
        std::vector<Arena> displacement;
        for (size_t i = 0; i < replicas; i++) {
            Arena theta = phi[i];
            engine.sgd(theta, i, uint64_t(r) * inner, inner, inner_lr);
            displacement.push_back(minus(theta, phi[i]));
            messages.push_back(encode_message(plan, RoundingKey{node_id[i], uint64_t(r), 0},
                                              displacement[i].data(), residual[i].data(), false));
        }
        const Arena before = phi[0];
        for (size_t i = 0; i < replicas; i++) {
            // Each replica decodes on its own, some on one thread and some on two.
            const test::ScopedCpuThreads threads(1 + int(i % 2));
            std::vector<Arena> decoded(replicas, Arena(engine.size()));
            for (size_t j = 0; j < replicas; j++) {
                decode_message(messages[j], manifest.fingerprint(), manifest, decoded[j].data(),
                               decoded[j].size());
            }
            // Q8 is lossy: had a replica used its exact own D, it would disagree with the others.
            CHECK_FALSE(same_bits(decoded[i], displacement[i]));
            outer_step(config, phi[i], delta[i], mean_of({decoded[0], decoded[1], decoded[2]}), {});
        }
        CHECK_FALSE(same_bits(phi[0], before));
        for (size_t i = 1; i < replicas; i++) {
            CAPTURE(i);
            CHECK(same_bits(phi[i], phi[0]));
            CHECK(same_bits(delta[i], delta[0]));
            CHECK_FALSE(same_bits(residual[i], residual[0]));
        }
    }
}
