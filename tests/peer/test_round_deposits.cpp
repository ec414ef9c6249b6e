// DiLoCo's round messages of a private member (peer/round_deposits.h), on real nodes over
// loopback: nobody can dial the private node, so it deposits its message with its anchors and the
// others gather it from them, bit for bit; an anchor takes a deposit only from a member anchored
// to it, only signed by that member and only within its share of the relay limit.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstring>
#include <random>

#include <grpcpp/client_context.h>

#include "codec/message.h"
#include "model/manifest.h"
#include "peer/anchors.h"
#include "peer/auth.h"
#include "peer/local_cluster.h"
#include "peer/round_deposits.h"
#include "starling/v1/peer.grpc.pb.h"
#include "tests/peer/cluster_util.h"
#include "tests/support/model_configs.h"

using namespace starling;
using namespace starling::test;
using namespace std::chrono_literals;

namespace {

// 885,888 parameters: a Q8 message of about 0.94 MB, an F32 one of 3.5 MB.
const ParameterManifest& model() {
    static const ParameterManifest m(four_layer_model_config(128, 384, 256));
    return m;
}

// `author`'s message of `round`, signed, and the values it decodes to.
struct Authored {
    RoundMessage message;
    std::vector<float> values;
};

Authored authored(const NodeIdentity& author, uint64_t round, codec::Codec codec, uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> dist(0.0f, 0.02f);
    std::vector<float> source(model().total());
    for (float& v : source) v = dist(rng);
    const codec::MessagePlan plan = codec::make_plan(model(), codec::PlanKind::Delta, codec);
    codec::MessageEncoder encoder(plan, {author.node_id(), round, 0}, source.data(), nullptr,
                                  false);
    auto encoded = std::make_shared<codec::EncodedMessage>(codec::encode_to_end(encoder));
    Authored a;
    a.values.resize(model().total());
    codec::MessageDecoder decoder(model().fingerprint(), model(), a.values.data(), a.values.size());
    codec::decode_to_end(encoded->header, encoded->chunks, decoder);
    a.message = {encoded, 100 + seed, sign_round_message(author, round, *encoded, 100 + seed)};
    return a;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// What `gatherer` gathers of `author`'s round: the error ("" when whole) and the values.
std::pair<std::string, std::vector<float>> gather_one(PeerNode& gatherer, uint64_t author,
                                                      uint64_t round) {
    std::vector<float> into(model().total());
    codec::MessageDecoder decoder(model().fingerprint(), model(), into.data(), into.size());
    codec::MessageDecoder* decoders[] = {&decoder};
    const uint64_t members[] = {author};
    uint64_t bytes = 0;
    const auto gathered = gatherer.rounds().gather(round, members, decoders, &bytes);
    return {gathered[0].error, into};
}

bool anchors(const PeerNode& node, const std::vector<uint64_t>& ids) {
    return std::find(ids.begin(), ids.end(), node.node_id()) != ids.end();
}

// Until `hidden` holds its anchors and every public member names them.
void wait_for_anchors(LocalCluster& cluster, size_t public_members, PeerNode& hidden) {
    wait_for("two anchors, named in every member's table", 30000ms, [&] {
        const std::vector<uint64_t> held = hidden.anchors();
        if (held.size() != kAnchorsWanted) return false;
        for (size_t i = 0; i < public_members; i++) {
            bool named = false;
            for (const Member& m : cluster.node(i).members())
                named |= m.node_id == hidden.node_id() && m.anchors == held &&
                         m.reachability == Reachability::Private;
            if (!named) return false;
        }
        return true;
    });
}

uint64_t relayed_by(LocalCluster& cluster, size_t public_members) {
    uint64_t total = 0;
    for (size_t i = 0; i < public_members; i++) total += cluster.node(i).relayed_bytes();
    return total;
}

}  // namespace

TEST_CASE("a private node's round message is gathered from its anchors") {
    PeerConfig base = local_cluster_config();
    base.relay_limit_mib = 2;  // each anchor anchors one member: a share of 2 MiB
    LocalCluster cluster(3, base);
    const NodeIdentity hidden_id = NodeIdentity::generate();
    PeerNode& hidden = add_private_node(cluster, hidden_id);
    wait_for_anchors(cluster, 3, hidden);
    const std::vector<uint64_t> held = hidden.anchors();

    const Authored first = authored(hidden_id, 1, codec::Codec::Q8, 1);
    hidden.rounds().publish(1, first.message);
    // Every public member, anchor or not, gets it whole and bit for bit: none can dial the
    // private node, so it came from an anchor.
    for (size_t i = 0; i < 3; i++) {
        INFO("member " << i << (anchors(cluster.node(i), held) ? ", an anchor" : ""));
        const auto [error, values] = gather_one(cluster.node(i), hidden.node_id(), 1);
        CHECK(error.empty());
        CHECK(same_bits(values, first.values));
    }
    // Each anchor took the message in, and between them they served it three times.
    const uint64_t size = first.message.message->bytes();
    const auto relayed = [&] { return relayed_by(cluster, 3); };
    wait_for("both deposits taken", 10000ms,
             [&] { return relayed() >= (kAnchorsWanted + 3) * size; });
    CHECK(relayed() == (kAnchorsWanted + 3) * size);
    for (size_t i = 0; i < 3; i++)
        CHECK((cluster.node(i).relayed_bytes() > 0) == anchors(cluster.node(i), held));

    // The next round replaces nothing it still needs: both rounds are there to fetch.
    const Authored second = authored(hidden_id, 2, codec::Codec::Q8, 2);
    hidden.rounds().publish(2, second.message);
    CHECK(same_bits(gather_one(cluster.node(0), hidden.node_id(), 2).second, second.values));
    CHECK(same_bits(gather_one(cluster.node(1), hidden.node_id(), 1).second, first.values));

    // What anchors refuse, each call as the private node makes it.
    // The anchor gatherers try first, and the member that is no anchor.
    PeerNode* anchor = nullptr;
    PeerNode* other = nullptr;
    for (size_t i = 0; i < 3; i++) {
        if (cluster.node(i).node_id() == held.front()) anchor = &cluster.node(i);
        if (!anchors(cluster.node(i), held)) other = &cluster.node(i);
    }
    REQUIRE((anchor && other));
    // Calls as the private node makes them (a member: anchors serve members only).
    SwarmAuth auth(base.swarm_secret, hidden_id);
    const auto deposit = [&](PeerNode& to, uint64_t round, const RoundMessage& message) {
        grpc::ClientContext context;
        context.set_deadline(std::chrono::system_clock::now() + 5s);
        auth.attach(context, "DepositRoundMessage");
        return deposit_round_message(*v1::Peer::NewStub(swarm_channel(to.address())), context,
                                     round, message);
    };
    // The message of `round` as `from` serves it, within `limit`.
    const auto fetch = [&](PeerNode& from, uint64_t round, std::chrono::milliseconds limit) {
        std::pair<FetchedRoundMessage, std::vector<float>> got;
        got.second.resize(model().total());
        codec::MessageDecoder decoder(model().fingerprint(), model(), got.second.data(),
                                      got.second.size());
        grpc::ClientContext context;
        context.set_deadline(std::chrono::system_clock::now() + limit);
        auth.attach(context, "FetchRoundMessage");
        uint64_t bytes = 0;
        got.first =
            fetch_round_message(*v1::Peer::NewStub(swarm_channel(from.address())), context, round,
                                hidden.node_id(), hidden_id.public_key(), decoder, &bytes);
        return got;
    };
    const Authored third = authored(hidden_id, 3, codec::Codec::Q8, 3);
    CHECK_THAT(deposit(*other, 3, third.message),
               Catch::Contains("PERMISSION_DENIED") &&
                   Catch::Contains("holds no anchor stream to this node"));

    Authored forged = authored(hidden_id, 3, codec::Codec::Q8, 3);
    forged.message.signature =
        authored(NodeIdentity::generate(), 3, codec::Codec::Q8, 3).message.signature;
    CHECK_THAT(
        deposit(*anchor, 3, forged.message),
        Catch::Contains("INVALID_ARGUMENT") &&
            Catch::Contains("its signature is not node " + format_node_id(hidden.node_id())));
    Authored altered = authored(hidden_id, 3, codec::Codec::Q8, 3);
    auto bytes = std::make_shared<codec::EncodedMessage>(*altered.message.message);
    bytes->chunks.back().back() ^= std::byte{1};
    altered.message.message = bytes;
    CHECK_THAT(deposit(*anchor, 3, altered.message), Catch::Contains("its signature is not node"));
    // A round refused is answered NOT_FOUND at once, not after the anchor's wait of 3 s for a
    // deposit, so a fetcher turns to the other anchor in time.
    const auto refused = fetch(*anchor, 3, 2500ms).first;
    CHECK(refused.absent);
    CHECK_THAT(refused.error, Catch::Contains("no message for round 3"));

    const Authored large = authored(hidden_id, 3, codec::Codec::F32, 3);
    REQUIRE(large.message.message->bytes() > (2u << 20));
    CHECK_THAT(deposit(*anchor, 3, large.message),
               Catch::Contains("RESOURCE_EXHAUSTED") &&
                   Catch::Contains(
                       "share of this node's relay limit ([peer].relay_limit_mib), 2097152 bytes"));
    // What it held stays.
    CHECK(same_bits(fetch(*anchor, 2, 5000ms).second, second.values));
    CHECK_THAT(deposit(*anchor, 1, first.message),
               Catch::Contains("round 1 is older than round 2 held here"));

    // After all that, the round's own message goes in whole, and out the same.
    CHECK(deposit(*anchor, 3, third.message).empty());
    const auto whole = fetch(*anchor, 3, 5000ms);
    CHECK(whole.first.error.empty());
    CHECK(same_bits(whole.second, third.values));
    // The signature binds the round: round 3's message deposited as round 4's.
    CHECK_THAT(deposit(*anchor, 4, third.message), Catch::Contains("its signature is not node"));
}

TEST_CASE("a round past at every anchor is given up at once, not asked for until the deadline") {
    // A member a round behind the others asks for rounds its anchors have moved past. Were it to
    // ask on until the exchange timeout, it would stay that late every round, and behind for good.
    PeerConfig base = local_cluster_config();
    base.exchange_timeout = 60s;
    LocalCluster cluster(3, base);
    const NodeIdentity hidden_id = NodeIdentity::generate();
    PeerNode& hidden = add_private_node(cluster, hidden_id);
    wait_for_anchors(cluster, 3, hidden);
    uint64_t deposited = 0;
    for (uint64_t round = 1; round <= 3; round++) {
        const Authored a =
            authored(hidden_id, round, codec::Codec::Q8, static_cast<uint32_t>(round));
        hidden.rounds().publish(round, a.message);
        deposited += kAnchorsWanted * a.message.message->bytes();
    }
    wait_for("every deposit taken", 10000ms, [&] { return relayed_by(cluster, 3) >= deposited; });

    const auto asked = SteadyClock::now();
    const auto [error, values] = gather_one(cluster.node(0), hidden.node_id(), 1);
    const auto took = SteadyClock::now() - asked;
    CHECK_THAT(error,
               Catch::Contains("no message for round 1 here any more: round 3 is the newest"));
    // Every anchor answered at once; asking on would have taken the whole timeout.
    CHECK(took < base.exchange_timeout / 2);
}
