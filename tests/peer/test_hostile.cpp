// Callers that are not swarm members, or send what no member would: each is refused with a
// status that says why, and the node carries on unharmed.
#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>

#include <catch2/catch.hpp>

#include <cmath>

#include "peer/auth.h"
#include "peer/exchange.h"
#include "peer/local_cluster.h"
#include "peer/wire.h"
#include "starling/v1/peer.grpc.pb.h"
#include "tests/peer/cluster_util.h"

using namespace starling;
using namespace starling::test;
using namespace std::chrono_literals;

namespace {

struct RawCaller {
    NodeIdentity identity = NodeIdentity::generate();
    std::unique_ptr<v1::Peer::Stub> stub;
    explicit RawCaller(const std::string& address)
        : stub(v1::Peer::NewStub(swarm_channel(address))) {}
};

void deadline(grpc::ClientContext& context) {
    context.set_deadline(std::chrono::system_clock::now() + 2s);
}

Member digest_of(const NodeIdentity& identity, const std::string& address) {
    Member m;
    m.node_id = identity.node_id();
    m.address = address;
    m.incarnation = 1;
    m.fingerprint = "local";
    m.swarm_id = "local";
    m.public_key = identity.public_key();
    m.instance = 9;
    return m;
}

}  // namespace

TEST_CASE(
    "a digest's step time reads back, and one that is negative, NaN or past a day is refused") {
    const NodeIdentity identity = NodeIdentity::generate();
    Member m = digest_of(identity, "127.0.0.1:9");
    m.step_seconds = 0.375;
    v1::MemberDigest digest;
    to_digest(m, &digest);
    const auto read = from_digest(digest);
    REQUIRE(std::holds_alternative<Member>(read));
    CHECK(std::get<Member>(read).step_seconds == 0.375);
    for (const double junk : {-1.0, std::nan(""), 86401.0, HUGE_VAL}) {
        digest.set_step_seconds(junk);
        const auto refused = from_digest(digest);
        REQUIRE(std::holds_alternative<std::string>(refused));
        CHECK_THAT(std::get<std::string>(refused), Catch::Contains("step time"));
    }
}

TEST_CASE("a digest's method reads back, and one longer than 128 bytes is refused") {
    const NodeIdentity identity = NodeIdentity::generate();
    Member m = digest_of(identity, "127.0.0.1:9");
    m.method = "noloco split";
    v1::MemberDigest digest;
    to_digest(m, &digest);
    const auto read = from_digest(digest);
    REQUIRE(std::holds_alternative<Member>(read));
    CHECK(std::get<Member>(read).method == "noloco split");
    digest.set_method(std::string(129, 'x'));
    const auto refused = from_digest(digest);
    REQUIRE(std::holds_alternative<std::string>(refused));
    CHECK_THAT(std::get<std::string>(refused), Catch::Contains("method longer than 128 bytes"));
}

TEST_CASE("peer RPCs without valid credentials get UNAUTHENTICATED and change nothing") {
    LocalCluster cluster(2);
    const auto nodes = nodes_of(cluster);
    wait_for("one view", 20000ms, [&] { return all_see_all_alive(nodes); });
    RawCaller caller(cluster.node(0).address());
    v1::GossipRequest request;
    to_digest(digest_of(caller.identity, "127.0.0.1:9"), request.add_members());
    v1::GossipResponse response;

    SECTION("no credentials at all") {
        grpc::ClientContext context;
        deadline(context);
        const auto status = caller.stub->Gossip(&context, request, &response);
        REQUIRE(status.error_code() == grpc::StatusCode::UNAUTHENTICATED);
        REQUIRE_THAT(status.error_message(), Catch::Contains("missing credentials"));
    }
    SECTION("the wrong swarm secret") {
        SwarmAuth wrong("another swarm's secret", caller.identity);
        grpc::ClientContext context;
        deadline(context);
        wrong.attach(context, "Gossip");
        const auto status = caller.stub->Gossip(&context, request, &response);
        REQUIRE(status.error_code() == grpc::StatusCode::UNAUTHENTICATED);
        REQUIRE_THAT(status.error_message(), Catch::Contains("wrong swarm secret"));
    }
    SECTION("credentials made for another method") {
        SwarmAuth right(cluster.base().swarm_secret, caller.identity);
        grpc::ClientContext context;
        deadline(context);
        right.attach(context, "Ping");
        REQUIRE(caller.stub->Gossip(&context, request, &response).error_code() ==
                grpc::StatusCode::UNAUTHENTICATED);
    }
    SECTION("credentials given twice, the second naming another node") {
        SwarmAuth right(cluster.base().swarm_secret, caller.identity);
        grpc::ClientContext context;
        deadline(context);
        right.attach(context, "Gossip");
        context.AddMetadata("starling-node", format_node_id(caller.identity.node_id() ^ 1));
        const auto status = caller.stub->Gossip(&context, request, &response);
        REQUIRE(status.error_code() == grpc::StatusCode::UNAUTHENTICATED);
        REQUIRE_THAT(status.error_message(), Catch::Contains("more than once"));
    }
    REQUIRE_FALSE(state_seen(cluster.node(0), caller.identity.node_id()).has_value());
    REQUIRE(cluster.node(0).members().size() == 2);
    // A forged leave or death would last; a probe answered late under load would not.
    wait_for("every member alive", 20000ms, [&] { return all_see_all_alive(nodes); });
}

TEST_CASE("a swarm member cannot forge digests, others' leaves or oversized messages") {
    LocalCluster cluster(2);
    const auto nodes = nodes_of(cluster);
    wait_for("one view", 20000ms, [&] { return all_see_all_alive(nodes); });
    RawCaller caller(cluster.node(0).address());
    SwarmAuth auth(cluster.base().swarm_secret, caller.identity);

    SECTION("a digest whose node id does not match its key is dropped") {
        Member forged = digest_of(caller.identity, "127.0.0.1:9");
        forged.node_id ^= 0xff;
        v1::GossipRequest request;
        to_digest(forged, request.add_members());
        v1::GossipResponse response;
        grpc::ClientContext context;
        deadline(context);
        auth.attach(context, "Gossip");
        REQUIRE(caller.stub->Gossip(&context, request, &response).ok());
        REQUIRE_FALSE(state_seen(cluster.node(0), forged.node_id).has_value());
        REQUIRE(response.members_size() == 2);
    }
    SECTION("a leave on behalf of another node") {
        Member other = digest_of(NodeIdentity::generate(), "127.0.0.1:9");
        other.node_id = cluster.node(1).node_id();
        v1::LeaveRequest request;
        to_digest(other, request.mutable_leaver());
        request.mutable_leaver()->set_state(v1::MEMBER_STATE_LEFT);
        v1::LeaveResponse response;
        grpc::ClientContext context;
        deadline(context);
        auth.attach(context, "Leave");
        REQUIRE(caller.stub->Leave(&context, request, &response).error_code() ==
                grpc::StatusCode::PERMISSION_DENIED);
        REQUIRE(state_seen(cluster.node(0), cluster.node(1).node_id()) == MemberState::Alive);
    }
    SECTION("a message over the size cap") {
        v1::GossipRequest request;
        Member huge = digest_of(caller.identity, "127.0.0.1:9");
        huge.fingerprint.assign(5u << 20, 'x');
        to_digest(huge, request.add_members());
        v1::GossipResponse response;
        grpc::ClientContext context;
        deadline(context);
        auth.attach(context, "Gossip");
        REQUIRE(caller.stub->Gossip(&context, request, &response).error_code() ==
                grpc::StatusCode::RESOURCE_EXHAUSTED);
    }
    SECTION(
        "a membership request over its cap, though under the exchange frame cap the server admits") {
        v1::GossipRequest request;
        Member large = digest_of(caller.identity, "127.0.0.1:9");
        large.fingerprint.assign((4u << 20) + 1000, 'x');
        to_digest(large, request.add_members());
        REQUIRE(request.ByteSizeLong() < kMaxExchangeFrameBytes);
        v1::GossipResponse response;
        grpc::ClientContext context;
        deadline(context);
        auth.attach(context, "Gossip");
        const auto status = caller.stub->Gossip(&context, request, &response);
        REQUIRE(status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED);
        REQUIRE_THAT(status.error_message(), Catch::Contains("above the cap"));
    }
    SECTION("a join under another node's id") {
        v1::JoinRequest request;
        to_digest(digest_of(NodeIdentity::generate(), "127.0.0.1:9"), request.mutable_joiner());
        v1::JoinResponse response;
        grpc::ClientContext context;
        deadline(context);
        auth.attach(context, "Join");
        REQUIRE(caller.stub->Join(&context, request, &response).error_code() ==
                grpc::StatusCode::PERMISSION_DENIED);
    }
    SECTION("a caller over its request rate") {
        int exhausted = 0;
        for (int i = 0; i < 5000 && exhausted == 0; ++i) {
            v1::PingRequest request;
            request.set_target_id(cluster.node(0).node_id());
            v1::PingResponse response;
            grpc::ClientContext context;
            deadline(context);
            auth.attach(context, "Ping");
            const auto status = caller.stub->Ping(&context, request, &response);
            if (status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED)
                ++exhausted;
            else
                REQUIRE(status.ok());
        }
        REQUIRE(exhausted == 1);
    }
    // A forged leave or death would last; a probe answered late under load would not.
    wait_for("every member alive", 20000ms, [&] { return all_see_all_alive(nodes); });
    REQUIRE(cluster.node(0).members().size() == 2);
}
