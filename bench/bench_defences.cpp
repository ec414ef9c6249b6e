// What each of the round's defences (docs/security.md) adds to a round, against the training the
// round holds, measured on one replica in one run: NoLoCo's sane() distances, held-out check and
// update sample of one partner (and with split messages the alignment of its D), DiLoCo's clip,
// direction and staleness tests over the members' D's (the judged step less the plain mean), and
// the signature each node makes of its message and checks of each message it takes. A round's
// training is H times the median inner step measured here. Medians of --reps repetitions after one
// warm-up; needs the config's data (train and validation shards).
#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdio>
#include <vector>

#include "bench/median.h"
#include "common/error.h"
#include "common/random.h"
#include "daemon/config.h"
#include "engine/member_round.h"
#include "engine/replica.h"
#include "kernels/backend.h"
#include "optimizer/outer_round.h"
#include "peer/message_signature.h"
#include "peer/round_messages.h"

using namespace starling;

namespace {

// Signing this node's message and checking `checked` messages of the same size.
double signature_seconds(const EngineConfig& engine, const ParameterManifest& manifest,
                         std::span<const float> values, int checked, int reps) {
    const codec::MessagePlan plan = round_message_plans(engine, manifest).first;
    const NodeIdentity author = NodeIdentity::generate();
    codec::MessageEncoder encoder(plan, {author.node_id(), 1, 0}, values.data(), nullptr,
                                  engine.exchange.zstd);
    const codec::EncodedMessage message = codec::encode_to_end(encoder);
    return bench::median_seconds(reps, [&] {
        const Signature signature = sign_round_message(author, 1, message, 0);
        for (int k = 0; k < checked; k++) {
            MessageDigest digest(author.node_id(), 1, 0, 0);
            digest.add(message.header);
            for (const auto& chunk : message.chunks) digest.add(chunk);
            if (!digest.verify(author.public_key(), signature))
                throw Error("the message's own signature did not verify");
        }
    });
}

void print_row(const char* what, double seconds, double round_s) {
    std::printf("%-48s %8.4f s  %5.2f%% of the round's training\n", what, seconds,
                100.0 * seconds / round_s);
}

int run(int argc, char** argv) {
    CLI::App app{"bench_defences: what the round's defences add to a round's training"};
    std::string config_path = std::string(STARLING_SOURCE_DIR) + "/configs/pico.toml";
    int noloco_h = 20, diloco_h = 50, members = 8, reps = 5;
    app.add_option("--config", config_path, "model, batch and data config");
    app.add_option("--noloco-inner-steps", noloco_h, "H of a NoLoCo round");
    app.add_option("--diloco-inner-steps", diloco_h, "H of a DiLoCo round");
    app.add_option("--members", members, "DiLoCo's members, each D judged by every one");
    app.add_option("--reps", reps, "repetitions");
    CLI11_PARSE(app, argc, argv);
    if (members < 3) throw Error("--members must be at least 3 (the direction test's least)");

    EngineConfig engine;
    engine.train = load_train_config(config_path);
    const TrainConfig& config = engine.train;
    const Backend backend = make_backend({config.device, config.threads, config.matmul});
    Replica replica(config, 1, backend, 0, 1);
    const LrSchedule schedule = config.lr_schedule();
    const double step_s =
        bench::median_seconds(reps, [&] { (void)replica.inner_phase(noloco_h, schedule); }) /
        noloco_h;
    const size_t n = replica.theta().size();
    const std::vector<float> theta(replica.theta().begin(), replica.theta().end());
    const std::vector<float> phi(replica.phi().begin(), replica.phi().end());
    // The members' D's: this replica's update, each member's with its own noise of half its size
    // (honest D's of one round point alike, cosines 0.85 to 0.98 in the swarm experiment).
    std::vector<float> own_d(n);
    for (size_t i = 0; i < n; i++) own_d[i] = theta[i] - phi[i];
    const double d_rms = euclidean_distance(own_d, {}) / std::sqrt(static_cast<double>(n));
    std::vector<std::vector<float>> ds(members, own_d);
    for (int m = 1; m < members; m++)
        for (size_t i = 0; i < n; i++)
            ds[m][i] += static_cast<float>(0.5 * d_rms * normal_at(hash_index(7, m), i));
    std::vector<float> partner(n);
    for (size_t i = 0; i < n; i++) partner[i] = phi[i] + ds[1][i];

    std::printf("%s on %s: %zu parameters, batch %d x %d, inner step %.4f s\n", config_path.c_str(),
                backend.description.c_str(), n, config.batch_size, config.effective_seq_len(),
                step_s);

    const double noloco_round = noloco_h * step_s;
    std::printf("\nNoLoCo, H %d (round's training %.3f s), one partner, fused messages:\n",
                noloco_h, noloco_round);
    MessageSanity sanity;
    const double sane_s = bench::median_seconds(reps, [&] {
        const double own_update = euclidean_distance(theta, phi);
        if (sanity.check(partner, theta, own_update))
            throw Error("an ordinary partner was refused");
    });
    const double held_out_s = bench::median_seconds(reps, [&] {
        (void)replica.held_out_loss(theta);
        (void)replica.held_out_loss(partner);
    });
    // Split messages carry the partner's D: the alignment test is one pass over both D's.
    const double alignment_s = bench::median_seconds(reps, [&] {
        if (unaligned_update(ds[1], own_d)) throw Error("an ordinary partner's D was refused");
    });
    engine.method = OuterMethod::NoLoCo;
    const double noloco_signature_s = signature_seconds(engine, replica.manifest(), theta, 1, reps);
    // Fused messages carry theta and phi at coordinates the round draws: drawing them, gathering
    // the sample, the rounding bounds of the partner's theta there and judging its update at them,
    // as the outer step with the sample less the same step without it. The partner's phi is this
    // node's, so its update is its D.
    const RoundPlans plans = round_message_plans(engine, replica.manifest());
    const OuterConfig outer;
    auto fused_step_s = [&](bool sampled) {
        return bench::median_seconds(reps, [&] {
            std::vector<uint64_t> at;
            std::vector<float> sample_theta, sample_phi, rounding;
            if (sampled) {
                at = sample_coordinates(1, n, plans.second.numel / 2);
                rounding = codec::rounding_bounds(plans.first, partner, at);
            }
            for (const uint64_t i : at) {
                sample_theta.push_back(partner[i]);
                sample_phi.push_back(phi[i]);
            }
            PartnerChecks checks;
            checks.sample_at = at;
            std::vector<float> stepped = phi, momentum(n, 0.0f), a(n), b(n);
            const MemberValues self{.node_id = 1, .values = theta};
            const MemberValues other{.node_id = 2,
                                     .values = partner,
                                     .sample_theta = sample_theta,
                                     .sample_phi = sample_phi,
                                     .sample_rounding = rounding};
            if (!noloco_outer_step(outer, MessageMode::Fused, self, {&other, 1}, checks, stepped,
                                   momentum, a, b)
                     .refused.empty())
                throw Error("an ordinary partner was refused at its update sample");
        });
    };
    const double sample_s = fused_step_s(true) - fused_step_s(false);
    print_row("sane(): the distances", sane_s, noloco_round);
    print_row("held-out check: own weights and the partner's", held_out_s, noloco_round);
    print_row("signature: own made, the partner's checked", noloco_signature_s, noloco_round);
    print_row("all of them", sane_s + held_out_s + noloco_signature_s + sample_s, noloco_round);
    print_row("the update sample: drawn, gathered and judged", sample_s, noloco_round);
    print_row("split messages add: the alignment of D's", alignment_s, noloco_round);
    std::printf(
        "the update sample, theta and phi at %llu coordinates, adds %llu bytes to theta's "
        "%llu (%.1f%%)\n",
        static_cast<unsigned long long>(plans.second.numel / 2),
        static_cast<unsigned long long>(codec::payload_bytes(plans.second)),
        static_cast<unsigned long long>(codec::payload_bytes(plans.first)),
        100.0 * codec::payload_bytes(plans.second) / codec::payload_bytes(plans.first));

    const double diloco_round = diloco_h * step_s;
    std::printf("\nDiLoCo, H %d (round's training %.3f s), %d members, Q8 D's:\n", diloco_h,
                diloco_round, members);
    std::vector<std::span<const float>> decoded(ds.begin(), ds.end());
    std::vector<float> step_phi(phi), momentum(n), scratch(n);
    const auto outer_step_seconds = [&](bool judge) {
        return bench::median_seconds(reps, [&] {
            (void)diloco_outer_step(engine.outer, decoded, step_phi, momentum, scratch, {}, judge);
        });
    };
    const double judged_s = outer_step_seconds(true), plain_s = outer_step_seconds(false);
    engine.method = OuterMethod::DiLoCo;
    const double diloco_signature_s =
        signature_seconds(engine, replica.manifest(), own_d, members - 1, reps);
    print_row("clip, direction and staleness (judged - plain)", judged_s - plain_s, diloco_round);
    print_row("signature: own made, every other's checked", diloco_signature_s, diloco_round);
    print_row("all of them", judged_s - plain_s + diloco_signature_s, diloco_round);
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    try {
        return run(argc, argv);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "bench_defences: %s\n", e.what());
        return 1;
    }
}
