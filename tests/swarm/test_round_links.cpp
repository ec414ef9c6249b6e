// One round protocol, two links (engine/round_link.h): the same replicas, from the same seeds and
// node ids, run MemberRound through the in-process board the experiment runs on and through
// PeerNodes on real gRPC servers on 127.0.0.1, and must end on the same phi and momentum bits
// with the same bytes counted.
#include <catch2/catch.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <memory>

#include "daemon/swarm/peer_round_link.h"
#include "engine/in_process_link.h"
#include "engine/member_round.h"
#include "model/manifest.h"
#include "peer/local_cluster.h"
#include "tests/peer/cluster_util.h"
#include "tests/swarm/swarm_util.h"

using namespace starling;
using namespace starling::test;
using namespace std::chrono_literals;

namespace {

// Where each member ends: its phi and momentum, and what every round's step reported.
struct MemberEnd {
    std::vector<float> phi, momentum;
    std::vector<RoundOutcome> outcomes;
};

// `rounds` rounds of `config` for members with `ids`: H inner steps each, then every member's
// MemberRound at once, one thread each, over link_for(i). begin(round) runs before each exchange.
// Overlapped, the round's message is a copy of theta while the replica restarts from the solo
// step's phi and trains two steps before the outer step lands as a rebase (engine/overlap.h).
std::vector<MemberEnd> run_rounds(const SwarmConfig& config, const std::vector<uint64_t>& ids,
                                  int rounds, bool overlap,
                                  const std::function<RoundLink&(size_t)>& link_for,
                                  const std::function<void(uint64_t)>& begin) {
    const Backend backend =
        make_backend({config.train.device, config.train.threads, config.train.matmul});
    const LrSchedule schedule(config.train.lr_schedule());
    const size_t n = ids.size();
    std::vector<std::unique_ptr<Replica>> replicas;
    std::vector<std::unique_ptr<MemberRound>> members;
    for (size_t i = 0; i < n; i++) {
        replicas.push_back(std::make_unique<Replica>(config.train, static_cast<int>(n), backend,
                                                     static_cast<int>(i), ids[i]));
        members.push_back(std::make_unique<MemberRound>(config, replicas[i]->manifest()));
    }
    const size_t size = replicas[0]->size();
    std::vector<std::vector<float>> sent(n), start(n, std::vector<float>(size)),
        solo_momentum(n, std::vector<float>(size));
    const uint64_t tokens = static_cast<uint64_t>(config.inner_steps) * config.train.batch_size *
                            config.train.effective_seq_len();
    std::vector<MemberEnd> ends(n);
    for (int round = 0; round < rounds; round++) {
        for (size_t i = 0; i < n; i++) {
            Replica& r = *replicas[i];
            r.inner_phase(config.inner_steps, schedule);
            members[i]->prepare(r);
            sent[i].assign(r.theta().begin(), r.theta().end());
            if (overlap) {
                members[i]->overlapped_start(r, sent[i], start[i], solo_momentum[i]);
                r.restart_from(start[i]);
            }
        }
        begin(static_cast<uint64_t>(round));
        on_threads(n, [&](size_t i) {
            ends[i].outcomes.push_back(members[i]->step(
                link_for(i), *replicas[i], static_cast<uint64_t>(round), sent[i], tokens));
        });
        for (size_t i = 0; i < n; i++) {
            Replica& r = *replicas[i];
            if (overlap) {
                r.inner_phase(2, schedule);
                r.rebase_onto_phi(start[i], config.residual_in_weights());
            } else {
                r.restart_from_phi(config.residual_in_weights());
            }
        }
    }
    for (size_t i = 0; i < n; i++) {
        ends[i].phi.assign(replicas[i]->phi().begin(), replicas[i]->phi().end());
        ends[i].momentum.assign(replicas[i]->momentum().begin(), replicas[i]->momentum().end());
    }
    return ends;
}

// Deadlines far beyond what loopback needs: a busy machine slows the rounds, and none goes solo.
PeerConfig patient_peers(const SwarmConfig& config) {
    PeerConfig peer = local_cluster_config();
    const ParameterManifest manifest(config.train.model);
    peer.fingerprint = manifest.fingerprint();
    peer.model = model_signature(config.train.model);
    peer.probe_timeout = 2s;
    peer.membership.suspicion_timeout = 60s;
    peer.pair_timeout = 60s;
    peer.exchange_timeout = 60s;
    return peer;
}

// The rounds through both links; the gRPC one's node ids are the in-process one's too.
void check_links_agree(const SwarmConfig& config, size_t count, int rounds, bool overlap) {
    LocalCluster cluster(static_cast<int>(count), patient_peers(config));
    std::vector<PeerNode*> peers;
    std::vector<uint64_t> ids;
    std::vector<std::unique_ptr<PeerRoundLink>> grpc_links;
    for (size_t i = 0; i < count; i++) {
        peers.push_back(&cluster.node(i));
        ids.push_back(cluster.node(i).node_id());
        grpc_links.push_back(std::make_unique<PeerRoundLink>(cluster.node(i)));
    }
    wait_for("one view", 60000ms,
             [&] { return all_see_all_alive(peers) && same_pairable_view(peers); });
    const std::vector<MemberEnd> over_grpc = run_rounds(
        config, ids, rounds, overlap, [&](size_t i) -> RoundLink& { return *grpc_links[i]; },
        [](uint64_t) {});

    InProcessBoard board;
    std::vector<std::unique_ptr<RoundLink>> board_links;
    for (const uint64_t id : ids) board_links.push_back(board.link(id));
    const std::vector<MemberEnd> in_process = run_rounds(
        config, ids, rounds, overlap, [&](size_t i) -> RoundLink& { return *board_links[i]; },
        [&](uint64_t round) { board.begin_round(round, ids, 2); });

    for (size_t i = 0; i < count; i++) {
        INFO("member " << i);
        for (int round = 0; round < rounds; round++) {
            INFO("round " << round);
            const RoundOutcome& a = over_grpc[i].outcomes[round];
            const RoundOutcome& b = in_process[i].outcomes[round];
            CHECK(a.failure.empty());
            CHECK_FALSE(a.solo);
            CHECK(a.members == static_cast<int>(count));
            CHECK(a.bytes_received > 0);
            CHECK(b.members == a.members);
            CHECK(b.partner == a.partner);
            CHECK(b.bytes_sent == a.bytes_sent);
            CHECK(b.bytes_received == a.bytes_received);
        }
        CHECK(same_bits(over_grpc[i].phi, in_process[i].phi));
        CHECK(same_bits(over_grpc[i].momentum, in_process[i].momentum));
    }
}

}  // namespace

TEST_CASE("round links: two NoLoCo members land on the same bits in process and over gRPC") {
    SwarmConfig config = pico_swarm(2);
    config.method = OuterMethod::NoLoCo;
    check_links_agree(config, 2, 2, false);
}

TEST_CASE("round links: three DiLoCo members land on the same bits in process and over gRPC") {
    SwarmConfig config = pico_swarm(2);
    config.method = OuterMethod::DiLoCo;
    check_links_agree(config, 3, 2, false);
}

TEST_CASE(
    "round links: overlapped split NoLoCo members land on the same bits in process and over "
    "gRPC") {
    SwarmConfig config = pico_swarm(2);
    config.method = OuterMethod::NoLoCo;
    config.exchange.mode = MessageMode::Split;
    config.exchange.error_feedback = true;
    check_links_agree(config, 2, 2, true);
}

TEST_CASE(
    "round links: DiLoCo members with TOPK deltas land on the same bits in process and over gRPC, "
    "sequential and overlapped") {
    SwarmConfig config = pico_swarm(2);
    config.method = OuterMethod::DiLoCo;
    config.exchange.delta_codec = codec::Codec::TOPK;
    config.exchange.topk_chunk = 1024;
    config.exchange.topk_density = 0.03;
    REQUIRE(config.residual_in_weights());
    check_links_agree(config, 3, 2, GENERATE(false, true));
}

TEST_CASE("DiLoCo members with TOPK deltas keep what their messages left unsent in their weights") {
    SwarmConfig config = pico_swarm(1);
    config.method = OuterMethod::DiLoCo;
    config.outer = {0.0f, 1.0f, 0.7f, MomentumForm::HeavyBall};  // phi moves by the plain mean
    config.exchange.delta_codec = codec::Codec::TOPK;
    config.exchange.topk_chunk = 1024;
    config.exchange.topk_density = 0.03;
    REQUIRE(config.residual_in_weights());
    const Backend backend =
        make_backend({config.train.device, config.train.threads, config.train.matmul});
    const LrSchedule schedule(config.train.lr_schedule());
    const std::vector<uint64_t> ids{11, 22, 33};
    const size_t n = ids.size();
    InProcessBoard board;
    std::vector<std::unique_ptr<Replica>> replicas;
    std::vector<std::unique_ptr<MemberRound>> members;
    std::vector<std::unique_ptr<RoundLink>> links;
    std::vector<std::vector<float>> displacement(n), theta(n);
    for (size_t i = 0; i < n; i++) {
        replicas.push_back(
            std::make_unique<Replica>(config.train, int(n), backend, int(i), ids[i]));
        members.push_back(std::make_unique<MemberRound>(config, replicas[i]->manifest()));
        links.push_back(board.link(ids[i]));
        Replica& r = *replicas[i];
        r.inner_phase(config.inner_steps, schedule);
        members[i]->prepare(r);
        displacement[i].assign(r.displacement().begin(), r.displacement().end());
        theta[i].assign(r.theta().begin(), r.theta().end());
    }
    const std::vector<float> phi_before(replicas[0]->phi().begin(), replicas[0]->phi().end());
    board.begin_round(0, ids, 2);
    std::vector<RoundOutcome> outcomes(n);
    on_threads(n, [&](size_t i) {
        outcomes[i] = members[i]->step(*links[i], *replicas[i], 0, theta[i], 0);
    });

    const size_t size = replicas[0]->size();
    std::vector<std::vector<float>> sent(n, std::vector<float>(size));
    for (size_t i = 0; i < n; i++) {
        const auto message = board.sent(0, ids[i], ids[i], 0xffffffffu);  // DiLoCo's published
        REQUIRE(message);
        codec::MessageDecoder decoder(replicas[i]->manifest().fingerprint(),
                                      replicas[i]->manifest(), sent[i].data(), size);
        codec::decode_to_end(message->header, message->chunks, decoder);
    }
    for (size_t i = 0; i < n; i++) {
        INFO("member " << i);
        Replica& r = *replicas[i];
        CHECK(same_bits(r.phi(), replicas[0]->phi()));
        size_t kept = 0, mismatched_residual = 0, mismatched_theta = 0;
        r.restart_from_phi(config.residual_in_weights());
        for (size_t k = 0; k < size; k++) {
            // The message carried D alone, and what it did not carry is the residual exactly.
            if (r.residual()[k] != displacement[i][k] - sent[i][k]) mismatched_residual++;
            if (r.theta()[k] != r.phi()[k] + r.residual()[k]) mismatched_theta++;
            if (sent[i][k] != 0.0f) kept++;
        }
        CHECK(mismatched_residual == 0);
        CHECK(mismatched_theta == 0);
        CHECK(kept > 0);
        CHECK(kept < size / 4);  // 3% of the large tensors, the small ones whole
    }
    // phi moved by the mean of what was sent (outer lr 1, no momentum), each message clipped to
    // the median norm of the three (optimizer/outer_round.h).
    for (const RoundOutcome& o : outcomes) CHECK(o.members == 3);
    std::vector<double> norms;
    for (const auto& v : sent) {
        double squares = 0.0;
        for (const float x : v) squares += double(x) * x;
        norms.push_back(std::sqrt(squares));
    }
    std::vector<double> sorted = norms;
    std::sort(sorted.begin(), sorted.end());
    size_t off = 0;
    for (size_t k = 0; k < size; k++) {
        double mean = 0.0;
        for (size_t m = 0; m < n; m++) mean += std::min(1.0, sorted[1] / norms[m]) * sent[m][k];
        mean /= 3.0;
        if (std::abs(replicas[0]->phi()[k] - (phi_before[k] + mean)) > 1e-6) off++;
    }
    CHECK(off == 0);
}

TEST_CASE("a NoLoCo member whose own values are not finite judges no partner and blames none") {
    // A diverged member would otherwise refuse every honest message against its own NaN and
    // quarantine their authors, as if they were the faulty ones.
    SwarmConfig config = pico_swarm(1);
    config.method = OuterMethod::NoLoCo;
    const Backend backend =
        make_backend({config.train.device, config.train.threads, config.train.matmul});
    const LrSchedule schedule(config.train.lr_schedule());
    const std::vector<uint64_t> ids{11, 22};
    InProcessBoard board;
    std::vector<std::unique_ptr<Replica>> replicas;
    std::vector<std::unique_ptr<MemberRound>> members;
    std::vector<std::unique_ptr<RoundLink>> links;
    for (size_t i = 0; i < ids.size(); i++) {
        replicas.push_back(
            std::make_unique<Replica>(config.train, int(ids.size()), backend, int(i), ids[i]));
        members.push_back(std::make_unique<MemberRound>(config, replicas[i]->manifest()));
        links.push_back(board.link(ids[i]));
    }
    replicas[1]->phi()[5] = NAN;
    replicas[1]->restart_from_phi(false);
    for (uint64_t round = 0; round < 2; round++) {
        std::vector<std::vector<float>> theta(ids.size());
        for (size_t i = 0; i < ids.size(); i++) {
            Replica& r = *replicas[i];
            r.inner_phase(config.inner_steps, schedule);
            members[i]->prepare(r);
            theta[i].assign(r.theta().begin(), r.theta().end());
        }
        board.begin_round(round, ids, 2);
        std::vector<RoundOutcome> outcomes(ids.size());
        on_threads(ids.size(), [&](size_t i) {
            outcomes[i] = members[i]->step(*links[i], *replicas[i], round, theta[i], 0);
        });
        INFO("round " << round);
        CHECK(outcomes[1].solo);
        CHECK_THAT(outcomes[1].failure,
                   Catch::Contains("partner 000000000000000b: not judged: this node's own"));
        CHECK(outcomes[0].solo);  // its message is the broken one
        CHECK_THAT(outcomes[0].failure,
                   Catch::Contains("partner 0000000000000016: value 5 is not finite"));
        const auto judgements = board.take_judgements();
        REQUIRE(judgements.size() == 1);  // the honest member's alone
        CHECK(judgements[0].judge == 11);
        CHECK(judgements[0].member == 22);
        CHECK(judgements[0].refused);
        CHECK(judgements[0].quarantined == (round == 1));  // the second refusal in a row
        for (size_t i = 0; i < ids.size(); i++) replicas[i]->restart_from_phi(false);
    }
}
