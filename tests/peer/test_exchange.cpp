// The exchange stream between paired nodes, on real gRPC servers (local_cluster_config: Pair calls
// 1 s, exchanges 3 s). What a side receives must equal, bit for bit, what the codec decodes
// from the partner's encoder output directly (codec::encode_message and decode_message).
#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>

#include <omp.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <cstring>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <random>
#include <thread>

#include "model/manifest.h"
#include "codec/message.h"
#include "peer/auth.h"
#include "peer/exchange_relay.h"
#include "peer/local_cluster.h"
#include "peer/message_signature.h"
#include "peer/round_messages.h"
#include "starling/v1/peer.grpc.pb.h"
#include "tests/peer/cluster_util.h"
#include "tests/support/model_configs.h"

using namespace starling;
using namespace starling::test;
using namespace std::chrono_literals;

namespace {

using Bytes = std::vector<std::byte>;

// 885,888 parameters: one chunk in Q8 or F32.
const ParameterManifest& one_chunk_model() {
    static const ParameterManifest m(four_layer_model_config(128, 384, 256));
    return m;
}

// 3,541,248 parameters: four chunks in F32.
const ParameterManifest& four_chunk_model() {
    static const ParameterManifest m(four_layer_model_config(256, 768, 512));
    return m;
}

std::vector<float> normal_arena(size_t n, uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> dist(0.0f, 0.02f);
    std::vector<float> x(n);
    for (float& v : x) v = dist(rng);
    return x;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// One node's part in an exchange: the arena it sends, its encoder, and where the partner's
// message lands.
struct Side {
    Side(const ParameterManifest& m, codec::Codec codec, uint64_t node_id, uint64_t round,
         uint32_t seed)
        : manifest(m),
          plan(codec::make_plan(m, codec::PlanKind::Delta, codec)),
          key{node_id, round, 0},
          source(normal_arena(m.total(), seed)),
          encoder(plan, key, source.data(), nullptr, false),
          received(m.total()),
          decoder(m.fingerprint(), m, received.data(), received.size()) {}

    ExchangeSlot slot(uint64_t partner) { return slot(partner, outgoing_message(encoder)); }
    ExchangeSlot slot(uint64_t partner, OutgoingMessage outgoing) {
        return {key.round, partner, std::move(outgoing), decoder, {}, 0};
    }

    Bytes::size_type message_bytes() const {
        size_t total = 0;
        for (const Bytes& part : codec::encode_message(plan, key, source.data(), nullptr, false))
            total += part.size();
        return total;
    }
    // What this side's message decodes to, straight from the encoder's output.
    std::vector<float> decoded_directly() const {
        std::vector<float> out(source.size());
        codec::decode_message(codec::encode_message(plan, key, source.data(), nullptr, false),
                              manifest.fingerprint(), manifest, out.data(), out.size());
        return out;
    }

    const ParameterManifest& manifest;
    codec::MessagePlan plan;
    codec::RoundingKey key;
    std::vector<float> source;
    codec::MessageEncoder encoder;
    std::vector<float> received;
    codec::MessageDecoder decoder;
};

struct Pair {
    PeerNode* lower;
    PeerNode* higher;
};

// The two nodes of `cluster`, once they agree on membership and have paired for `round`.
Pair pair_two(LocalCluster& cluster, uint64_t round) {
    const auto nodes = nodes_of(cluster);
    wait_for("one view", 20000ms,
             [&] { return all_see_all_alive(nodes) && same_pairable_view(nodes); });
    const auto partners = choose_partners(nodes, round);
    REQUIRE(partners[0] == nodes[1]->node_id());
    REQUIRE(partners[1] == nodes[0]->node_id());
    return nodes[0]->node_id() < nodes[1]->node_id() ? Pair{nodes[0], nodes[1]}
                                                     : Pair{nodes[1], nodes[0]};
}

// Two started nodes with identities the test holds, `lower` the one with the lower id.
struct KnownPair {
    KnownPair() {
        if (lower_id.node_id() > higher_id.node_id()) std::swap(lower_id, higher_id);
        lower = std::make_unique<PeerNode>(base, lower_id);
        lower->start();
        PeerConfig joining = base;
        joining.seeds = {lower->address()};
        higher = std::make_unique<PeerNode>(joining, higher_id);
        higher->start();
        wait_for("one view", 20000ms, [&] {
            return all_see_all_alive({lower.get(), higher.get()});
        });
    }
    const PeerConfig base = local_cluster_config();
    NodeIdentity lower_id = NodeIdentity::generate(), higher_id = NodeIdentity::generate();
    std::unique_ptr<PeerNode> lower, higher;
};

struct Timed {
    ExchangeResult result;
    std::chrono::milliseconds took{};
};

// exchange() on both nodes at once, each on its own thread.
std::pair<Timed, Timed> exchange_both(PeerNode& a, ExchangeSlot slot_a, PeerNode& b,
                                      ExchangeSlot slot_b) {
    Timed at_a, at_b;
    const auto run = [](PeerNode& node, ExchangeSlot slot, Timed& out) {
        const auto start = std::chrono::steady_clock::now();
        out.result = node.rounds().exchange(std::move(slot));
        out.took = std::chrono::duration_cast<std::chrono::milliseconds>(
            std::chrono::steady_clock::now() - start);
    };
    std::thread other([&] { run(b, std::move(slot_b), at_b); });
    run(a, std::move(slot_a), at_a);
    other.join();
    return {std::move(at_a), std::move(at_b)};
}

// One side per node for `round`, each with an arena of its own.
std::vector<std::unique_ptr<Side>> sides_of(const std::vector<PeerNode*>& nodes, uint64_t round,
                                            codec::Codec codec) {
    std::vector<std::unique_ptr<Side>> sides;
    for (size_t i = 0; i < nodes.size(); ++i)
        sides.push_back(std::make_unique<Side>(one_chunk_model(), codec, nodes[i]->node_id(), round,
                                               static_cast<uint32_t>(round * 100 + i)));
    return sides;
}

struct RoundOutcome {
    std::vector<std::optional<uint64_t>> partners;  // in the order of the nodes
    std::vector<ExchangeResult> results;
};

// choose_partner(round) and then the exchange with the partner on every node at once, one thread
// each, as nodes of a swarm do; node i sends sides[i]'s message and says it trained 1000 + i
// tokens. `between(i, partner)` runs on node i's thread between the two, where given.
RoundOutcome pair_and_exchange(const std::vector<PeerNode*>& nodes, uint64_t round,
                               const std::vector<std::unique_ptr<Side>>& sides,
                               const std::function<void(size_t, uint64_t)>& between = {}) {
    RoundOutcome out{std::vector<std::optional<uint64_t>>(nodes.size()),
                     std::vector<ExchangeResult>(nodes.size())};
    std::vector<std::thread> threads;
    for (size_t i = 0; i < nodes.size(); ++i) {
        threads.emplace_back([&, i] {
            const auto partner = nodes[i]->rounds().choose_partner(round);
            if (!partner) return;
            out.partners[i] = partner->node_id;
            if (between) between(i, partner->node_id);
            ExchangeSlot slot = sides[i]->slot(partner->node_id);
            slot.tokens = 1000 + i;  // said with the header, to weigh the outer step
            out.results[i] = nodes[i]->rounds().exchange(std::move(slot));
        });
    }
    for (auto& thread : threads) thread.join();
    return out;
}

// The deadline bound: the exchange timeout and a few moments for a cancelled stream to end on a
// busy machine.
std::chrono::milliseconds deadline_bound(const LocalCluster& cluster) {
    return cluster.base().exchange_timeout + 3000ms;
}

}  // namespace

TEST_CASE(
    "eight paired nodes exchange Q8 and F32 messages that decode exactly like the encoder's output") {
    LocalCluster cluster(8);
    const auto nodes = nodes_of(cluster);
    wait_for("one view", 20000ms,
             [&] { return all_see_all_alive(nodes) && same_pairable_view(nodes); });
    std::map<uint64_t, size_t> index_of;
    for (size_t i = 0; i < nodes.size(); ++i) index_of[nodes[i]->node_id()] = i;

    for (const auto& [round, codec] :
         {std::pair{1u, codec::Codec::Q8}, std::pair{2u, codec::Codec::F32}}) {
        INFO("round " << round << ", " << codec::codec_name(codec));
        const auto sides = sides_of(nodes, round, codec);
        const auto [partners, results] = pair_and_exchange(nodes, round, sides);
        for (size_t i = 0; i < nodes.size(); ++i) {
            REQUIRE(partners[i].has_value());
            const size_t j = index_of.at(*partners[i]);
            REQUIRE(partners[j] == nodes[i]->node_id());
            INFO("node " << i << " with node " << j << ": " << results[i].error);
            CHECK(results[i].delivered);
            CHECK(results[i].received);
            CHECK(results[i].error.empty());
            CHECK(same_bits(sides[i]->received, sides[j]->decoded_directly()));
            CHECK(results[i].bytes_sent == sides[i]->message_bytes());
            CHECK(results[i].bytes_received == sides[j]->message_bytes());
            CHECK(results[i].partner_tokens == 1000 + j);
        }
    }
}

TEST_CASE("four-chunk messages stream both ways at once and arrive whole") {
    LocalCluster cluster(2);
    const auto [lower, higher] = pair_two(cluster, 1);
    Side low(four_chunk_model(), codec::Codec::F32, lower->node_id(), 1, 1);
    Side high(four_chunk_model(), codec::Codec::F32, higher->node_id(), 1, 2);
    REQUIRE(low.encoder.chunk_count() == 4);
    // The opening side reads on the calling thread, coding with one OpenMP thread meanwhile; the
    // caller's own setting must be back afterwards.
    const int threads_before = omp_get_max_threads();
    omp_set_num_threads(3);
    const auto [at_low, at_high] =
        exchange_both(*lower, low.slot(higher->node_id()), *higher, high.slot(lower->node_id()));
    CHECK(omp_get_max_threads() == 3);
    omp_set_num_threads(threads_before);
    INFO(at_low.result.error << " | " << at_high.result.error);
    for (const Timed* t : {&at_low, &at_high}) {
        CHECK(t->result.delivered);
        CHECK(t->result.received);
    }
    CHECK(same_bits(low.received, high.decoded_directly()));
    CHECK(same_bits(high.received, low.decoded_directly()));
    CHECK(at_low.result.bytes_sent == low.message_bytes());
    CHECK(at_high.result.bytes_received == low.message_bytes());
}

TEST_CASE(
    "a partner killed before the exchange: the survivor's exchange fails within the deadline") {
    const bool kill_lower = GENERATE(true, false);
    INFO((kill_lower ? "the opening side" : "the answering side") << " is killed");
    LocalCluster cluster(2);
    const auto [lower, higher] = pair_two(cluster, 1);
    PeerNode& victim = kill_lower ? *lower : *higher;
    PeerNode& survivor = kill_lower ? *higher : *lower;
    Side side(one_chunk_model(), codec::Codec::Q8, survivor.node_id(), 1, 3);
    victim.kill();
    const auto start = std::chrono::steady_clock::now();
    const ExchangeResult result = survivor.rounds().exchange(side.slot(victim.node_id()));
    const auto took = std::chrono::steady_clock::now() - start;
    INFO(result.error);
    CHECK_FALSE(result.received);
    CHECK_FALSE(result.delivered);
    CHECK_THAT(result.error, Catch::Contains(format_node_id(victim.node_id())));
    CHECK(took < deadline_bound(cluster));
}

TEST_CASE(
    "a partner killed during the exchange: the survivor's exchange fails within the deadline") {
    const bool kill_lower = GENERATE(true, false);
    INFO((kill_lower ? "the opening side" : "the answering side") << " is killed");
    LocalCluster cluster(2);
    const auto [lower, higher] = pair_two(cluster, 1);
    PeerNode& victim = kill_lower ? *lower : *higher;
    PeerNode& survivor = kill_lower ? *higher : *lower;
    Side victim_side(four_chunk_model(), codec::Codec::F32, victim.node_id(), 1, 4);
    Side survivor_side(four_chunk_model(), codec::Codec::F32, survivor.node_id(), 1, 5);
    // The victim's chunks come slowly, so the kill lands with its message partly sent.
    std::atomic<bool> streaming{false};
    OutgoingMessage slow = outgoing_message(victim_side.encoder);
    slow.next_chunk = [&](ChunkBuffer& chunk) {
        streaming = true;
        std::this_thread::sleep_for(150ms);
        return victim_side.encoder.next_chunk(*chunk);
    };
    std::thread killer([&] {
        while (!streaming) std::this_thread::sleep_for(5ms);
        std::this_thread::sleep_for(200ms);
        victim.kill();
    });
    const auto [at_victim, at_survivor] =
        exchange_both(victim, victim_side.slot(survivor.node_id(), std::move(slow)), survivor,
                      survivor_side.slot(victim.node_id()));
    killer.join();
    INFO(at_survivor.result.error);
    CHECK_FALSE(at_survivor.result.received);
    CHECK_FALSE(at_survivor.result.error.empty());
    CHECK(at_survivor.took < deadline_bound(cluster));
    CHECK(at_victim.took < deadline_bound(cluster));
}

TEST_CASE(
    "a corrupt chunk: the receiver names the checksum error, the sender is told, the other way arrives") {
    const bool corrupt_lower = GENERATE(true, false);
    INFO((corrupt_lower ? "the opening side" : "the answering side") << " sends a corrupt chunk");
    LocalCluster cluster(2);
    const auto [lower, higher] = pair_two(cluster, 1);
    PeerNode& sender = corrupt_lower ? *lower : *higher;
    PeerNode& receiver = corrupt_lower ? *higher : *lower;
    Side bad(one_chunk_model(), codec::Codec::Q8, sender.node_id(), 1, 6);
    Side good(one_chunk_model(), codec::Codec::Q8, receiver.node_id(), 1, 7);
    OutgoingMessage flipped = outgoing_message(bad.encoder);
    flipped.next_chunk = [&](ChunkBuffer& chunk) {
        const bool more = bad.encoder.next_chunk(*chunk);
        if (more) chunk->back() ^= std::byte{0x01};  // the payload's last byte
        return more;
    };
    const auto [at_sender, at_receiver] =
        exchange_both(sender, bad.slot(receiver.node_id(), std::move(flipped)), receiver,
                      good.slot(sender.node_id()));
    INFO("sender: " << at_sender.result.error << " | receiver: " << at_receiver.result.error);
    CHECK_FALSE(at_receiver.result.received);
    CHECK_THAT(at_receiver.result.error, Catch::Contains("checksum mismatch"));
    CHECK_FALSE(at_sender.result.delivered);
    CHECK_THAT(at_sender.result.error,
               Catch::Contains("refused by the partner") && Catch::Contains("checksum mismatch"));
    if (corrupt_lower) CHECK_THAT(at_sender.result.error, Catch::Contains("INVALID_ARGUMENT"));
    // One bad direction does not cost the other.
    CHECK(at_sender.result.received);
    CHECK(at_receiver.result.delivered);
    CHECK(same_bits(bad.received, good.decoded_directly()));
}

TEST_CASE("a message cut short is reported as incomplete, within the deadline") {
    const bool cut_lower = GENERATE(true, false);
    INFO((cut_lower ? "the opening side" : "the answering side") << " stops after one chunk");
    LocalCluster cluster(2);
    const auto [lower, higher] = pair_two(cluster, 1);
    PeerNode& sender = cut_lower ? *lower : *higher;
    PeerNode& receiver = cut_lower ? *higher : *lower;
    Side cut(four_chunk_model(), codec::Codec::F32, sender.node_id(), 1, 8);
    Side whole(four_chunk_model(), codec::Codec::F32, receiver.node_id(), 1, 9);
    OutgoingMessage one_chunk = outgoing_message(cut.encoder);
    one_chunk.next_chunk = [&, sent = 0](ChunkBuffer& chunk) mutable {
        return sent++ < 1 && cut.encoder.next_chunk(*chunk);
    };
    const auto [at_sender, at_receiver] =
        exchange_both(sender, cut.slot(receiver.node_id(), std::move(one_chunk)), receiver,
                      whole.slot(sender.node_id()));
    INFO("sender: " << at_sender.result.error << " | receiver: " << at_receiver.result.error);
    CHECK_FALSE(at_receiver.result.received);
    CHECK_THAT(at_receiver.result.error, Catch::Contains("1 of 4 chunks"));
    CHECK_FALSE(at_sender.result.delivered);
    CHECK(at_sender.took < deadline_bound(cluster));
    CHECK(at_receiver.took < deadline_bound(cluster));
}

TEST_CASE(
    "a pairing only one side still holds (its partner restarted) fails the exchange at once") {
    const bool lower_survives = GENERATE(true, false);
    const PeerConfig base = local_cluster_config();
    // Two identities in id order, so the survivor is the opening or the answering side as asked.
    NodeIdentity first = NodeIdentity::generate(), second = NodeIdentity::generate();
    if (first.node_id() > second.node_id()) std::swap(first, second);
    const NodeIdentity survivor_id = lower_survives ? first : second;
    const NodeIdentity restarted_id = lower_survives ? second : first;
    INFO("the survivor is the " << (lower_survives ? "opening" : "answering") << " side");

    PeerNode survivor(base, survivor_id);
    survivor.start();
    PeerConfig joining = base;
    joining.seeds = {survivor.address()};
    auto other = std::make_unique<PeerNode>(joining, restarted_id);
    other->start();
    wait_for("one view", 20000ms, [&] { return all_see_all_alive({&survivor, other.get()}); });
    const auto partners = choose_partners({&survivor, other.get()}, 1);
    REQUIRE(partners[0] == restarted_id.node_id());
    REQUIRE(partners[1] == survivor_id.node_id());

    // The partner crashes and comes back on the same address with the same key, knowing nothing
    // of the pairing.
    joining.listen = other->address();
    other->kill();
    other = std::make_unique<PeerNode>(joining, restarted_id);
    other->start();
    wait_for("the restarted node is alive again", 20000ms, [&] {
        return all_see_all_alive({&survivor, other.get()});
    });

    Side side(one_chunk_model(), codec::Codec::Q8, survivor.node_id(), 1, 21);
    const auto start = std::chrono::steady_clock::now();
    const ExchangeResult result = survivor.rounds().exchange(side.slot(restarted_id.node_id()));
    const auto took = std::chrono::steady_clock::now() - start;
    INFO(result.error);
    CHECK_FALSE(result.received);
    CHECK_THAT(result.error, Catch::Contains("not") && Catch::Contains("partner") ||
                                 Catch::Contains("not paired"));
    // Told at once, instead of waiting out the exchange timeout for a partner that is not coming.
    CHECK(took < base.exchange_timeout / 3);
}

TEST_CASE("an exchange stream from a node that is not the round's partner is refused") {
    LocalCluster cluster(2);
    const auto [lower, higher] = pair_two(cluster, 1);
    const NodeIdentity outsider = NodeIdentity::generate();
    SwarmAuth auth(cluster.base().swarm_secret, outsider);
    PeerNode& target = GENERATE(0, 1) == 0 ? *lower : *higher;
    const auto stub = v1::Peer::NewStub(swarm_channel(target.address()));
    const auto stream_status = [&](uint64_t round, bool authenticate) {
        grpc::ClientContext context;
        context.set_deadline(std::chrono::system_clock::now() + 2s);
        if (authenticate) auth.attach(context, "Exchange");
        const auto stream = stub->Exchange(&context);
        v1::ExchangeFrame frame;
        frame.set_round(round);
        frame.set_header(std::string(codec::kHeaderBytes, 'x'));
        stream->Write(frame);
        stream->WritesDone();
        while (stream->Read(&frame)) {
        }
        return stream->Finish();
    };
    CHECK(stream_status(1, false).error_code() == grpc::StatusCode::UNAUTHENTICATED);
    const auto paired_round = stream_status(1, true);
    CHECK(paired_round.error_code() == grpc::StatusCode::PERMISSION_DENIED);
    CHECK_THAT(paired_round.error_message(), Catch::Contains("not this node's partner"));
    CHECK(stream_status(50, true).error_code() == grpc::StatusCode::PERMISSION_DENIED);

    // Nor does a node exchange with anyone for a round it did not pair for.
    Side low(one_chunk_model(), codec::Codec::Q8, lower->node_id(), 2, 10);
    const auto unpaired = lower->rounds().exchange(low.slot(higher->node_id()));
    CHECK_THAT(unpaired.error, Catch::Contains("not this node's partner"));

    // The partners themselves are unaffected.
    Side a(one_chunk_model(), codec::Codec::Q8, lower->node_id(), 1, 11);
    Side b(one_chunk_model(), codec::Codec::Q8, higher->node_id(), 1, 12);
    const auto [at_a, at_b] =
        exchange_both(*lower, a.slot(higher->node_id()), *higher, b.slot(lower->node_id()));
    INFO(at_a.result.error << " | " << at_b.result.error);
    CHECK(at_a.result.received);
    CHECK(at_b.result.received);
    CHECK(same_bits(a.received, b.decoded_directly()));
}

TEST_CASE(
    "an exchange's budget follows the partner's measured rate, within the floor and the ceiling") {
    using std::chrono::milliseconds;
    const milliseconds floor = 10s, ceiling = 600s;
    // 130 MB, a 124M-parameter model's Q8 message, before any exchange: 10 Mbit/s assumed.
    CHECK(exchange_budget(130'000'000, std::nullopt, 1.25e6, floor, ceiling) == 416s);
    // Measured at 100 MB/s: four times 1.3 s, below the floor.
    CHECK(exchange_budget(130'000'000, 1e8, 1.25e6, floor, ceiling) == floor);
    // At 1 Mbit/s it would need 1040 s x 4: the ceiling.
    CHECK(exchange_budget(130'000'000, 125'000.0, 1.25e6, floor, ceiling) == ceiling);
    // pico's 130 KB over 1 Mbit/s: 4.2 s, the floor.
    CHECK(exchange_budget(130'000, 125'000.0, 1.25e6, floor, ceiling) == floor);
    CHECK(exchange_budget(1'000'000, 0.0, 1.25e6, floor, ceiling) ==
          ceiling);  // a rate of 0 is taken as 1 B/s
}

TEST_CASE("a partner that never sends leaves the next exchange's budget as it was") {
    // The opening side writes its whole message into the stream, but the partner never posts its
    // own: nothing arrives, so the timed-out exchange teaches nothing about the link.
    LocalCluster cluster(2);
    const auto [lower, higher] = pair_two(cluster, 1);
    Side side(one_chunk_model(), codec::Codec::Q8, lower->node_id(), 1, 8);
    const ExchangeResult result = lower->rounds().exchange(side.slot(higher->node_id()));
    INFO(result.error);
    CHECK_FALSE(result.received);
    CHECK(result.bytes_received == 0);
    const PeerConfig& config = cluster.base();
    const uint64_t bytes = 10'000'000;
    CHECK(lower->rounds().exchange_budget_with(higher->node_id(), bytes) ==
          exchange_budget(bytes, std::nullopt, config.min_link_bytes_per_s, config.exchange_timeout,
                          config.exchange_timeout_max));
}

TEST_CASE("a partner late to the exchange does not lengthen the next budget by its lateness") {
    // The answering side posts its slot 2.5 s after the opening side started: the link moved the
    // messages in moments, and the next budget follows that, not the 2.5 s.
    const bool opener_late = GENERATE(false, true);
    INFO((opener_late ? "the opening side" : "the answering side") << " comes late");
    LocalCluster cluster(2);
    const auto [lower, higher] = pair_two(cluster, 1);
    PeerNode& early = opener_late ? *higher : *lower;
    PeerNode& late = opener_late ? *lower : *higher;
    Side early_side(one_chunk_model(), codec::Codec::Q8, early.node_id(), 1, 9);
    Side late_side(one_chunk_model(), codec::Codec::Q8, late.node_id(), 1, 10);
    std::thread late_thread([&] {
        std::this_thread::sleep_for(2500ms);
        late.rounds().exchange(late_side.slot(early.node_id()));
    });
    const auto start = std::chrono::steady_clock::now();
    const ExchangeResult result = early.rounds().exchange(early_side.slot(late.node_id()));
    const double took =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    late_thread.join();
    INFO(result.error);
    REQUIRE(result.received);
    REQUIRE(result.delivered);
    REQUIRE(took > 2.0);
    // The budget a rate with the wait counted would give, for 50 times the bytes moved: about
    // 200 times the wait, below the ceiling.
    const PeerConfig& config = cluster.base();
    const uint64_t moved = std::max(result.bytes_sent, result.bytes_received);
    const uint64_t bytes = 50 * moved;
    const auto with_wait =
        exchange_budget(bytes, static_cast<double>(moved) / took, config.min_link_bytes_per_s,
                        config.exchange_timeout, config.exchange_timeout_max);
    REQUIRE(with_wait < config.exchange_timeout_max);
    CHECK(early.rounds().exchange_budget_with(late.node_id(), bytes) * 2 < with_wait);
}

TEST_CASE("an exchanged message whose signature is not its sender's is refused, naming it") {
    const std::string sent =
        GENERATE(as<std::string>{}, "honestly signed", "signed by another key",
                 "with a token claim above the one signed", "without a signature");
    INFO("the opening side's message is sent " << sent);
    KnownPair nodes;
    const auto partners = choose_partners({nodes.lower.get(), nodes.higher.get()}, 1);
    REQUIRE(partners[0] == nodes.higher_id.node_id());

    // The answering node posts its side as in any round; the test opens the stream in the name
    // of the lower node, writing its frames itself, as a relay could.
    PeerNode& higher = *nodes.higher;
    Side answering(one_chunk_model(), codec::Codec::Q8, higher.node_id(), 1, 31);
    ExchangeResult at_higher;
    std::thread posted(
        [&] { at_higher = higher.rounds().exchange(answering.slot(nodes.lower_id.node_id())); });

    Side opening(one_chunk_model(), codec::Codec::Q8, nodes.lower_id.node_id(), 1, 32);
    SwarmAuth auth(nodes.base.swarm_secret, nodes.lower_id);
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + 3s);
    auth.attach(context, "Exchange");
    const auto stream = open_exchange_stream(swarm_channel(higher.address()), context);
    const uint64_t signed_tokens = 1000;
    MessageDigest digest(nodes.lower_id.node_id(), 1, 0, signed_tokens);
    ExchangeWireFrame frame;
    frame.fields.set_round(1);
    frame.fields.set_part(0);
    const std::vector<std::byte> header = opening.encoder.header_bytes();
    frame.fields.set_header(header.data(), header.size());
    frame.fields.set_tokens(sent == "with a token claim above the one signed" ? 10 * signed_tokens
                                                                              : signed_tokens);
    digest.add(header);
    CHECK(stream->Write(frame));
    frame.fields.clear_tokens();
    for (;;) {
        auto chunk = std::make_shared<std::vector<std::byte>>();
        if (!opening.encoder.next_chunk(*chunk)) break;
        digest.add(*chunk);
        frame.fields.clear_body();
        frame.chunk = chunk;
        frame.has_chunk = true;
        CHECK(stream->Write(frame));
    }
    if (sent != "without a signature") {
        const NodeIdentity other = NodeIdentity::generate();
        frame.has_chunk = false;
        frame.fields.set_signature(
            signature_bytes(digest.sign(sent == "signed by another key" ? other : nodes.lower_id)));
        CHECK(stream->Write(frame));
    }
    stream->WritesDone();
    while (stream->Read(&frame)) {
    }
    const grpc::Status status = stream->Finish();
    posted.join();
    INFO("at the answering node: " << at_higher.error << " | stream: " << status.error_message());
    if (sent == "honestly signed") {
        CHECK(at_higher.received);
        CHECK(at_higher.partner_tokens == signed_tokens);
        CHECK(same_bits(answering.received, opening.decoded_directly()));
        return;
    }
    CHECK_FALSE(at_higher.received);
    CHECK(status.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
    if (sent == "without a signature") {
        CHECK_THAT(at_higher.error, Catch::Contains("ended before the message's signature"));
    } else {
        CHECK(at_higher.refused);
        CHECK_THAT(at_higher.error, Catch::Contains("its signature is not node " +
                                                    format_node_id(nodes.lower_id.node_id())));
    }
}

TEST_CASE("a published round message is fetched only under its author's key") {
    KnownPair nodes;
    Side author(one_chunk_model(), codec::Codec::Q8, nodes.lower_id.node_id(), 4, 41);
    const auto message =
        std::make_shared<const codec::EncodedMessage>(codec::encode_to_end(author.encoder));
    nodes.lower->rounds().publish(4, RoundMessage{message, 512});
    const auto stub = v1::Peer::NewStub(swarm_channel(nodes.lower->address()));
    SwarmAuth auth(nodes.base.swarm_secret, nodes.higher_id);
    const auto fetch = [&](const PublicKey& key, std::vector<float>& into) {
        grpc::ClientContext context;
        context.set_deadline(std::chrono::system_clock::now() + 3s);
        auth.attach(context, "FetchRoundMessage");
        codec::MessageDecoder decoder(one_chunk_model().fingerprint(), one_chunk_model(),
                                      into.data(), into.size());
        uint64_t bytes = 0;
        return fetch_round_message(*stub, context, 4, nodes.lower_id.node_id(), key, decoder,
                                   &bytes);
    };
    std::vector<float> received(one_chunk_model().total());
    const FetchedRoundMessage whole = fetch(nodes.lower_id.public_key(), received);
    INFO(whole.error);
    CHECK(whole.error.empty());
    CHECK(whole.tokens == 512);
    CHECK(same_bits(received, author.decoded_directly()));

    const FetchedRoundMessage forged = fetch(nodes.higher_id.public_key(), received);
    CHECK(forged.refused);
    CHECK_THAT(forged.error, Catch::Contains("its signature is not node " +
                                             format_node_id(nodes.lower_id.node_id())));
}

namespace {

// Two public nodes and four private ones (announcing addresses nobody can dial), once every node
// sees every private one with its anchors, both public nodes.
struct HiddenSwarm {
    explicit HiddenSwarm(PeerConfig base = local_cluster_config()) : cluster(2, base) {
        for (int i = 0; i < 4; i++) hidden.push_back(&add_private_node(cluster, ids[i]));
        nodes = nodes_of(cluster);
        // The public nodes' verdicts too: a node whose own is pending names a relay when it
        // proposes to a private one (proposes_relay), which would add to the relayed exchanges.
        wait_for("one view, every verdict and every private node's anchors in it", 60000ms, [&] {
            if (!all_see_all_alive(nodes) || !same_pairable_view(nodes)) return false;
            for (const PeerNode* n : nodes)
                for (const Member& m : n->members())
                    if (m.reachability == Reachability::Unknown) return false;
            for (const PeerNode* h : hidden) {
                if (h->anchors().size() != 2) return false;
                for (const PeerNode* n : nodes)
                    for (const Member& m : n->members())
                        if (m.node_id == h->node_id() &&
                            (m.reachability != Reachability::Private || m.anchors != h->anchors()))
                            return false;
            }
            return true;
        });
    }
    NodeIdentity ids[4] = {NodeIdentity::generate(), NodeIdentity::generate(),
                           NodeIdentity::generate(), NodeIdentity::generate()};
    LocalCluster cluster;
    std::vector<PeerNode*> hidden;
    std::vector<PeerNode*> nodes;
};

// A RelayExchange call to `relay` in the name of `caller` for `partner` (0: none named), writing
// one frame of `round` and nothing else; the call's status.
grpc::Status call_relay(const PeerConfig& base, const NodeIdentity& caller, PeerNode& relay,
                        uint64_t partner, uint64_t round) {
    SwarmAuth auth(base.swarm_secret, caller);
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + 10s);
    if (partner != 0) context.AddMetadata(kRelayToMetadata, format_node_id(partner));
    auth.attach(context, "RelayExchange");
    const auto stream = open_exchange_stream(swarm_channel(relay.address()), context,
                                             ExchangeMethod::RelayExchange);
    ExchangeWireFrame frame;
    frame.fields.set_round(round);
    frame.fields.set_abort("a test's frame");
    stream->Write(frame);
    stream->WritesDone();
    while (stream->Read(&frame)) {
    }
    return stream->Finish();
}

}  // namespace

TEST_CASE(
    "two private nodes pair through an anchor and exchange over a punched connection, or through "
    "the anchor's relay without hole punching, as they would direct") {
    const bool punch = GENERATE(true, false);
    INFO((punch ? "hole punching on" : "hole punching off"));
    PeerConfig base = local_cluster_config();
    base.hole_punch = punch;
    // Time for one private side to start its exchange after the other's punch would have ended,
    // were the punch tried as the exchange starts rather than as the two pair.
    base.punch_timeout = 1000ms;
    base.exchange_timeout = 10000ms;
    HiddenSwarm swarm(base);
    const auto& nodes = swarm.nodes;
    std::map<uint64_t, size_t> index_of;
    for (size_t i = 0; i < nodes.size(); ++i) index_of[nodes[i]->node_id()] = i;
    std::vector<uint64_t> unreachable;
    for (const PeerNode* h : swarm.hidden) unreachable.push_back(h->node_id());
    const auto is_private = [&](size_t i) { return i >= 2; };
    const auto view = nodes.front()->pairable_ids();
    uint64_t relayed_pairs = 0;
    for (const uint64_t round : {1u, 2u, 3u}) {
        INFO("round " << round);
        const auto sides = sides_of(nodes, round, codec::Codec::Q8);
        // In the last round, the higher id of the private pair starts its exchange late.
        const auto late = [&](size_t i, uint64_t partner) {
            if (round == 3 && is_private(i) && is_private(index_of.at(partner)) &&
                nodes[i]->node_id() > partner)
                std::this_thread::sleep_for(base.punch_timeout + 1500ms);
        };
        const auto [partners, results] = pair_and_exchange(nodes, round, sides, late);
        // Each public node with a private one, and the two private ones left together.
        for (size_t i = 0; i < nodes.size(); ++i) {
            REQUIRE(partners[i] ==
                    deterministic_partner(round, view, nodes[i]->node_id(), unreachable));
            const size_t j = index_of.at(*partners[i]);
            INFO("node " << i << " with node " << j << ": " << results[i].error);
            if (is_private(i) && is_private(j)) {
                ++relayed_pairs;
                const auto relay = nodes[i]->rounds().relay_for(round, *partners[i]);
                REQUIRE(relay.has_value());
                CHECK(relay == nodes[j]->rounds().relay_for(round, nodes[i]->node_id()));
                CHECK((*relay == nodes[0]->node_id() || *relay == nodes[1]->node_id()));
            }
            CHECK(results[i].delivered);
            CHECK(results[i].received);
            CHECK(same_bits(sides[i]->received, sides[j]->decoded_directly()));
            CHECK(results[i].bytes_received == sides[j]->message_bytes());
        }
    }
    relayed_pairs /= 2;
    CHECK(relayed_pairs == 3);
    uint64_t relayed = 0, through = 0, relayed_bytes = 0;
    for (size_t i = 0; i < 2; i++) {
        relayed += nodes[i]->relayed_exchanges();
        relayed_bytes += nodes[i]->relayed_bytes();
    }
    uint64_t punches = 0, failed_punches = 0, punched = 0;
    for (const PeerNode* h : swarm.hidden) {
        through += h->exchanges_through_relay();
        punches += h->rounds().hole_punches();
        failed_punches += h->rounds().failed_hole_punches();
        punched += h->rounds().punched_exchanges();
    }
    if (punch) {
        // On loopback every punch connects, and nothing goes through the relays.
        CHECK(punches == 2 * relayed_pairs);
        CHECK(failed_punches == 0);
        CHECK(punched == 2 * relayed_pairs);
        CHECK(relayed == 0);
        CHECK(through == 0);
        return;
    }
    CHECK(punches + failed_punches + punched == 0);
    CHECK(relayed == relayed_pairs);
    CHECK(through == 2 * relayed_pairs);
    // Each relayed exchange carries both messages, their frames' own fields besides.
    const uint64_t messages =
        2 * relayed_pairs * Side(one_chunk_model(), codec::Codec::Q8, 1, 1, 1).message_bytes();
    CHECK(relayed_bytes >= messages);
    CHECK(relayed_bytes < messages + 2 * relayed_pairs * 4096);
}

TEST_CASE("a relay refuses what is not an exchange with a member it anchors") {
    PeerConfig base = local_cluster_config();
    SECTION("a relay that relays nothing") {
        base.relay_bytes_per_s = 0;
        HiddenSwarm swarm(base);
        grpc::Status status =
            call_relay(base, swarm.ids[0], *swarm.nodes[0], swarm.hidden[1]->node_id(), 1);
        CHECK(status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED);
        CHECK_THAT(status.error_message(), Catch::Contains("relay_mbit is 0"));
        // A proposal that would name it as the relay is refused before it reaches the member, at
        // each anchor in turn, so the two never believe they are paired.
        PeerNode& proposer = *swarm.hidden[0];
        std::optional<Member> target;
        for (const Member& m : proposer.members())
            if (m.node_id == swarm.hidden[1]->node_id()) target = m;
        REQUIRE(target.has_value());
        v1::PairRequest request;
        request.set_round(1);
        request.set_mode(v1::PAIR_MODE_RANDOM);
        v1::PairResponse response;
        uint64_t via = 0;
        status = proposer.rounds().relay_pair(*target, request, 2s, &response, &via);
        CHECK(status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED);
        CHECK_THAT(status.error_message(), Catch::Contains("relays no exchange"));
        CHECK(via == 0);
        CHECK(swarm.hidden[1]->rounds().relay_for(1, proposer.node_id()) == std::nullopt);
    }
    SECTION("one relay") {
        HiddenSwarm swarm(base);
        PeerNode& relay = *swarm.nodes[0];
        // No partner named.
        grpc::Status status = call_relay(base, swarm.ids[0], relay, 0, 1);
        CHECK(status.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
        CHECK_THAT(status.error_message(), Catch::Contains(kRelayToMetadata));
        // Two members neither of which it anchors: a public member that joins late, for the
        // other public one.
        const NodeIdentity late = NodeIdentity::generate();
        PeerConfig config = swarm.cluster.base();
        config.seeds = {relay.address()};
        const PeerNode& joined = swarm.cluster.add(config, late);
        wait_for("the late member known to the relay", 30000ms, [&] {
            for (const Member& m : relay.members())
                if (m.node_id == joined.node_id() && m.state == MemberState::Alive) return true;
            return false;
        });
        status = call_relay(base, late, relay, swarm.nodes[1]->node_id(), 1);
        CHECK(status.error_code() == grpc::StatusCode::PERMISSION_DENIED);
        CHECK_THAT(status.error_message(), Catch::Contains("anchors neither"));
        // A member it anchors and a public one, as a pairing agreed while the proposer's verdict
        // was pending makes them: relayed, whatever the relay now knows of the public one.
        auto from_public = std::async(std::launch::async, [&] {
            return call_relay(base, late, relay, swarm.hidden[0]->node_id(), 2);
        });
        status = call_relay(base, swarm.ids[0], relay, joined.node_id(), 2);
        CHECK(status.ok());
        CHECK(from_public.get().ok());
        CHECK(relay.relayed_exchanges() == 1);
        // A caller that is no member.
        const NodeIdentity stranger = NodeIdentity::generate();
        status = call_relay(base, stranger, relay, swarm.hidden[1]->node_id(), 1);
        CHECK(status.error_code() == grpc::StatusCode::PERMISSION_DENIED);
        CHECK_THAT(status.error_message(), Catch::Contains("not both members"));
        // A partner that never comes: refused once the exchange timeout has passed, not held.
        const auto start = std::chrono::steady_clock::now();
        status = call_relay(base, swarm.ids[0], relay, swarm.hidden[1]->node_id(), 1);
        CHECK(status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED);
        CHECK_THAT(status.error_message(), Catch::Contains("did not come to the relay"));
        CHECK(std::chrono::steady_clock::now() - start >= base.exchange_timeout);
        CHECK(relay.relayed_exchanges() == 1);
    }
}
