// Anchors (peer/anchors.h): which members a private node holds a stream to, how probes of it
// route through them (SwimCore), the digest field that names them, and real nodes on loopback: a
// node whose announced address nobody can dial is probed through its anchors, is no more suspect
// than a public member, and replaces an anchor that goes.
#include <catch2/catch.hpp>

#include <algorithm>
#include <map>
#include <numeric>

#include <grpcpp/client_context.h>

#include "peer/anchors.h"
#include "peer/auth.h"
#include "peer/pairing.h"
#include "peer/local_cluster.h"
#include "peer/swim.h"
#include "peer/wire.h"
#include "starling/v1/peer.grpc.pb.h"
#include "tests/peer/cluster_util.h"

using namespace starling;
using namespace starling::test;
using namespace std::chrono_literals;

namespace {

const SteadyClock::time_point t0{};

Member member(uint64_t id, Reachability reachability = Reachability::Public,
              MemberState state = MemberState::Alive) {
    Member m;
    m.node_id = id;
    m.address = "10.0.0." + std::to_string(id) + ":7700";
    m.incarnation = 5;
    m.state = state;
    m.reachability = reachability;
    m.fingerprint = "f";
    m.swarm_id = "s";
    m.instance = 1;
    return m;
}

std::function<std::optional<double>(uint64_t)> round_trips(std::map<uint64_t, double> rtt) {
    return [rtt](uint64_t id) -> std::optional<double> {
        const auto it = rtt.find(id);
        if (it == rtt.end()) return std::nullopt;
        return it->second;
    };
}

std::vector<uint64_t> ids_of(const std::vector<Member>& members) {
    std::vector<uint64_t> ids;
    for (const Member& m : members) ids.push_back(m.node_id);
    return ids;
}

std::optional<Member> seen(const PeerNode& observer, uint64_t node_id) {
    for (const Member& m : observer.members())
        if (m.node_id == node_id) return m;
    return std::nullopt;
}

}  // namespace

TEST_CASE("anchors: public members by round trip, then the undecided, never private or gone") {
    const std::vector<Member> members{member(1, Reachability::Public),
                                      member(2, Reachability::Public),
                                      member(3, Reachability::Unknown),
                                      member(4, Reachability::Private),
                                      member(5, Reachability::Public, MemberState::Suspect),
                                      member(6, Reachability::Public)};
    const auto rtt = round_trips({{1, 40.0}, {2, 12.0}, {3, 1.0}, {4, 0.5}, {5, 0.5}});
    // 6 was never measured: after 1 and 2, before the undecided 3.
    CHECK(choose_anchors(100, members, {}, rtt, {}) == std::vector<uint64_t>{2, 1});
    CHECK(choose_anchors(100, members, {}, rtt, {}, 4) == std::vector<uint64_t>{2, 1, 6, 3});
    CHECK(choose_anchors(100, members, {}, rtt, {2}) == std::vector<uint64_t>{1, 6});
    // Among the unmeasured, an order of its own per node, so that private nodes spread over the
    // public ones: each of them is somebody's first anchor, and every choice is two of them.
    std::map<uint64_t, int> first;
    for (uint64_t self = 1000; self < 1100; self++) {
        const auto chosen = choose_anchors(self, members, {}, round_trips({}), {});
        REQUIRE(chosen.size() == 2);
        REQUIRE(chosen[0] != chosen[1]);
        for (const uint64_t id : chosen) REQUIRE((id == 1 || id == 2 || id == 6));
        ++first[chosen[0]];
    }
    CHECK(first.size() == 3);
    for (const auto& [id, times] : first) CHECK(times >= 15);
}

TEST_CASE("anchors: a current anchor is kept while alive, whatever a newer round trip says") {
    const std::vector<Member> members{member(1), member(2), member(3),
                                      member(4, Reachability::Public, MemberState::Dead)};
    const auto rtt = round_trips({{1, 90.0}, {2, 5.0}, {3, 6.0}, {4, 1.0}});
    CHECK(choose_anchors(100, members, {1, 3}, rtt, {}) == std::vector<uint64_t>{1, 3});
    // 4 died and 9 left the table: their places go to the fastest others.
    CHECK(choose_anchors(100, members, {4, 1}, rtt, {}) == std::vector<uint64_t>{1, 2});
    CHECK(choose_anchors(100, members, {9, 4}, rtt, {}) == std::vector<uint64_t>{2, 3});
    CHECK(choose_anchors(100, {}, {1, 2}, rtt, {}).empty());
}

TEST_CASE("anchors: a suspected anchor is kept only while nobody else can take its place") {
    const std::vector<Member> alone{member(1, Reachability::Public, MemberState::Suspect),
                                    member(2, Reachability::Private)};
    const auto rtt = round_trips({{1, 5.0}});
    // The only public member, suspected: still the anchor, rather than none.
    CHECK(choose_anchors(100, alone, {1}, rtt, {}) == std::vector<uint64_t>{1});
    // Never taken up while suspected, and dropped once dead or refusing.
    CHECK(choose_anchors(100, alone, {}, rtt, {}).empty());
    CHECK(choose_anchors(100, alone, {1}, rtt, {1}).empty());
    const std::vector<Member> dead{member(1, Reachability::Public, MemberState::Dead)};
    CHECK(choose_anchors(100, dead, {1}, rtt, {}).empty());
    // With a live public member to take its place, the suspected one goes.
    std::vector<Member> more = alone;
    more.push_back(member(3, Reachability::Public));
    CHECK(choose_anchors(100, more, {1}, rtt, {}, 1) == std::vector<uint64_t>{3});
    // Two wanted: the live one, then the suspected one kept for the place nobody else fills.
    CHECK(choose_anchors(100, more, {1}, rtt, {}) == std::vector<uint64_t>{3, 1});
}

TEST_CASE("swim: a private member is pinged only by its anchors and probed through them") {
    SwimCore core(member(100), MembershipLimits{1000ms, 5000ms, 4096}, SwimSettings{}, 7);
    for (uint64_t id = 1; id <= 6; id++) core.table().merge(member(id), t0);
    Member hidden = member(50, Reachability::Private);
    hidden.anchors = {2, 4, 77};  // 77: not in this table
    core.table().merge(hidden, t0);
    CHECK_FALSE(core.direct_probe(hidden));
    CHECK(core.direct_probe(member(3)));
    CHECK(ids_of(core.indirect_helpers(50)) == std::vector<uint64_t>{2, 4});
    // Anchored by this node: its own ping goes down the stream.
    hidden.anchors = {100, 4};
    CHECK(core.direct_probe(hidden));
    hidden.incarnation++;
    core.table().merge(hidden, t0);
    CHECK(ids_of(core.indirect_helpers(50)) == std::vector<uint64_t>{4});
    // Without anchors nobody can reach it.
    hidden.anchors = {};
    hidden.incarnation++;
    core.table().merge(hidden, t0);
    CHECK(core.indirect_helpers(50).empty());
}

TEST_CASE("swim: private members are never asked to probe, nor gossiped with") {
    SwimCore core(member(100), MembershipLimits{1000ms, 5000ms, 4096}, SwimSettings{}, 11);
    for (uint64_t id = 1; id <= 3; id++) core.table().merge(member(id), t0);
    for (uint64_t id = 10; id <= 40; id++)
        core.table().merge(member(id, Reachability::Private), t0);
    for (int i = 0; i < 200; i++) {
        for (const Member& helper : core.indirect_helpers(1))
            REQUIRE(helper.reachability != Reachability::Private);
        const auto helpers = core.indirect_helpers(2);
        // Two callable members besides the target, however many private ones the draws hit.
        REQUIRE(helpers.size() == 2);
        const SwimCore::Period period = core.tick(t0);
        REQUIRE(period.gossip);
        REQUIRE(period.gossip->reachability != Reachability::Private);
    }
}

TEST_CASE("wire: a digest carries its anchors, and more than three are refused") {
    const NodeIdentity identity = NodeIdentity::generate();
    Member m = member(identity.node_id(), Reachability::Private);
    m.public_key = identity.public_key();
    m.anchors = {7, 9};
    v1::MemberDigest digest;
    to_digest(m, &digest);
    auto parsed = from_digest(digest);
    REQUIRE(std::holds_alternative<Member>(parsed));
    CHECK(std::get<Member>(parsed).anchors == std::vector<uint64_t>{7, 9});
    for (uint64_t extra : {11, 13}) digest.add_anchors(extra);
    parsed = from_digest(digest);
    REQUIRE(std::holds_alternative<std::string>(parsed));
    CHECK_THAT(std::get<std::string>(parsed), Catch::Contains("4 anchors, at most 3"));
}

TEST_CASE(
    "a private node is probed through its anchors, and is no more suspect than a public one") {
    LocalCluster cluster(3);
    PeerNode& hidden = add_private_node(cluster);
    const auto named_everywhere = [&] {
        const std::vector<uint64_t> anchors = hidden.anchors();
        if (anchors.size() != kAnchorsWanted) return false;
        for (size_t i = 0; i < 3; i++) {
            const auto m = seen(cluster.node(i), hidden.node_id());
            if (!m || m->anchors != anchors || m->state != MemberState::Alive) return false;
        }
        return true;
    };
    wait_for("two anchors, named in every member's table", 30000ms, named_everywhere);
    const std::vector<uint64_t> anchors = hidden.anchors();
    size_t anchoring = 0;
    for (size_t i = 0; i < 3; i++) {
        const bool anchor =
            std::find(anchors.begin(), anchors.end(), cluster.node(i).node_id()) != anchors.end();
        CHECK(cluster.node(i).anchored_members() == (anchor ? 1u : 0u));
        anchoring += anchor;
    }
    CHECK(anchoring == kAnchorsWanted);
    // Each refutation of a suspicion raises a node's incarnation: over many probes of the
    // private node through its anchors it is refuted no more often than a public member is.
    const uint64_t hidden_before = hidden.members().front().incarnation;
    const uint64_t public_before = cluster.node(1).members().front().incarnation;
    const auto pings = [&] {
        uint64_t total = 0;
        for (size_t i = 0; i < 3; i++) total += cluster.node(i).anchor_pings();
        return total;
    };
    const uint64_t pings_before = pings();
    wait_for("30 pings through its anchors", 60000ms, [&] { return pings() >= pings_before + 30; });
    const uint64_t hidden_raised = hidden.members().front().incarnation - hidden_before;
    const uint64_t public_raised = cluster.node(1).members().front().incarnation - public_before;
    CHECK(hidden_raised <= public_raised + 1);
    wait_for("alive at every member", 10000ms, [&] {
        for (size_t i = 0; i < 3; i++)
            if (state_seen(cluster.node(i), hidden.node_id()) != MemberState::Alive) return false;
        return true;
    });
}

TEST_CASE("a private node is paired with a public one, proposed to through its anchors") {
    LocalCluster cluster(3);
    PeerNode& hidden = add_private_node(cluster);
    const auto nodes = nodes_of(cluster);
    wait_for("one view, the private node's anchors in it", 30000ms, [&] {
        if (hidden.anchors().size() != kAnchorsWanted || !all_see_all_alive(nodes) ||
            !same_pairable_view(nodes))
            return false;
        for (size_t i = 0; i < 3; i++) {
            const auto m = seen(cluster.node(i), hidden.node_id());
            if (!m || m->anchors != hidden.anchors() || m->reachability != Reachability::Private)
                return false;
        }
        return true;
    });
    const auto view = nodes.front()->pairable_ids();
    const std::vector<uint64_t> unreachable{hidden.node_id()};
    for (uint64_t round = 1; round <= 4; ++round) {
        INFO("round " << round);
        const auto partners = choose_partners(nodes, round);
        // Four members, one private: it with a public one, the other two together.
        CHECK(require_mutual(nodes, partners) == 0);
        for (size_t i = 0; i < nodes.size(); ++i)
            CHECK(partners[i] ==
                  deterministic_partner(round, view, nodes[i]->node_id(), unreachable));
    }
    // Whichever side's proposal came first, the relay carried the public side's when it went
    // (a public node cannot dial the private one). Its path, call by call:
    const NodeIdentity stranger = NodeIdentity::generate();
    SwarmAuth auth(cluster.base().swarm_secret, stranger);
    const auto relay = [&](PeerNode& via, v1::PairResponse* response) {
        v1::RelayPairRequest request;
        request.set_target_id(hidden.node_id());
        request.mutable_pair()->set_round(9);
        request.mutable_pair()->set_mode(v1::PAIR_MODE_RANDOM);
        grpc::ClientContext context;
        context.set_deadline(std::chrono::system_clock::now() + 3s);
        auth.attach(context, "RelayPair");
        return v1::Peer::NewStub(swarm_channel(via.address()))
            ->RelayPair(&context, request, response);
    };
    for (size_t i = 0; i < 3; i++) {
        PeerNode& node = cluster.node(i);
        const auto anchors = hidden.anchors();
        const bool anchor =
            std::find(anchors.begin(), anchors.end(), node.node_id()) != anchors.end();
        v1::PairResponse response;
        const grpc::Status status = relay(node, &response);
        if (anchor) {
            // The private node's own answer: it does not know the stranger.
            REQUIRE(status.ok());
            CHECK_FALSE(response.accepted());
            CHECK_THAT(response.reason(), Catch::Contains("not a member this node knows"));
            CHECK(node.relayed_proposals() >= 1);
        } else {
            CHECK(status.error_code() == grpc::StatusCode::NOT_FOUND);
            CHECK_THAT(status.error_message(), Catch::Contains("holds no stream"));
        }
    }
}

TEST_CASE("a private node replaces an anchor that goes") {
    LocalCluster cluster(4);
    PeerNode& hidden = add_private_node(cluster);
    wait_for("two anchors", 30000ms, [&] { return hidden.anchors().size() == kAnchorsWanted; });
    const uint64_t gone = hidden.anchors().front();
    size_t index = 0;
    while (cluster.node(index).node_id() != gone) index++;
    cluster.node(index).leave();
    wait_for("another anchor in its place", 30000ms, [&] {
        const std::vector<uint64_t> now = hidden.anchors();
        return now.size() == kAnchorsWanted && std::find(now.begin(), now.end(), gone) == now.end();
    });
    for (const uint64_t anchor : hidden.anchors()) {
        size_t i = 0;
        while (cluster.node(i).node_id() != anchor) i++;
        wait_for("the new anchor holds its stream", 10000ms,
                 [&] { return cluster.node(i).anchored_members() == 1; });
    }
}

TEST_CASE("a proposal to a private node goes through its other anchor when one cannot be reached") {
    LocalCluster cluster(3);
    PeerNode& hidden = add_private_node(cluster);
    wait_for("two anchors, named in every member's table", 30000ms, [&] {
        if (hidden.anchors().size() != kAnchorsWanted) return false;
        for (size_t i = 0; i < 3; i++) {
            const auto m = seen(cluster.node(i), hidden.node_id());
            if (!m || m->anchors != hidden.anchors()) return false;
        }
        return true;
    });
    const std::vector<uint64_t> anchors = hidden.anchors();
    const auto index_of = [&](uint64_t id) {
        size_t i = 0;
        while (cluster.node(i).node_id() != id) i++;
        return i;
    };
    size_t proposer = 0;
    while (std::find(anchors.begin(), anchors.end(), cluster.node(proposer).node_id()) !=
           anchors.end())
        proposer++;
    // The anchor a proposal tries first dies without a word; the proposer still lists it alive
    // for the seconds until its failure is detected.
    cluster.node(index_of(anchors.front())).kill();
    PeerNode& other_anchor = cluster.node(index_of(anchors.back()));
    const uint64_t relayed_before = other_anchor.relayed_proposals();
    const auto target = seen(cluster.node(proposer), hidden.node_id());
    REQUIRE(target);
    v1::PairRequest request;
    request.set_round(9);
    request.set_nonce(1);
    request.set_mode(v1::PAIR_MODE_RANDOM);
    v1::PairResponse response;
    const grpc::Status status =
        cluster.node(proposer).rounds().relay_pair(*target, request, 10s, &response);
    INFO(status.error_message());
    REQUIRE(status.ok());
    CHECK(other_anchor.relayed_proposals() == relayed_before + 1);
}
