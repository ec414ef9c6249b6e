// Mutual TLS on the peer port, with certificates from a throwaway CA made by the openssl command:
// nodes whose certificates the swarm's CA signed form a swarm with no shared secret set; a node
// with a certificate from another CA, or a caller without TLS, gets nowhere.
#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>

#include <algorithm>
#include <catch2/catch.hpp>

#include "common/error.h"
#include "peer/auth.h"
#include "peer/local_cluster.h"
#include "starling/v1/peer.grpc.pb.h"
#include "tests/peer/cluster_util.h"
#include "tests/peer/tls_util.h"
#include "tests/support/files.h"

using namespace starling;
using namespace starling::test;
using namespace std::chrono_literals;

namespace {

PeerConfig tls_config(const TlsConfig& tls, const std::vector<std::string>& seeds) {
    PeerConfig config = local_cluster_config();
    config.swarm_secret.clear();  // the CA stands in for it
    config.tls = tls;
    config.seeds = seeds;
    return config;
}

bool knows(const PeerNode& observer, uint64_t node_id) {
    return state_seen(observer, node_id).has_value();
}

}  // namespace

TEST_CASE("nodes with certificates from the swarm's CA form a swarm, and others cannot reach it") {
    TempDir dir;
    make_ca(dir.path(), "swarm-ca");
    make_ca(dir.path(), "rogue-ca");

    LocalCluster cluster(0);
    PeerNode& first = cluster.add(tls_config(make_node_tls(dir.path(), "swarm-ca", "a"), {}));
    cluster.add(tls_config(make_node_tls(dir.path(), "swarm-ca", "b"), {first.address()}));
    cluster.add(tls_config(make_node_tls(dir.path(), "swarm-ca", "c"), {first.address()}));
    const auto nodes = nodes_of(cluster);
    wait_for("one view over TLS", 20000ms,
             [&] { return all_see_all_alive(nodes) && same_pairable_view(nodes); });
    // Partner choice runs over the same TLS connections: of three nodes, one pair and one solo.
    const auto partners = choose_partners(nodes, 1);
    size_t paired = 0;
    for (size_t i = 0; i < nodes.size(); ++i) {
        if (!partners[i]) continue;
        ++paired;
        const size_t j = std::find_if(nodes.begin(), nodes.end(),
                                      [&](PeerNode* n) { return n->node_id() == *partners[i]; }) -
                         nodes.begin();
        REQUIRE(j < nodes.size());
        CHECK(partners[j] == nodes[i]->node_id());
    }
    CHECK(paired == 2);

    SECTION("a node whose certificate another CA signed cannot join") {
        PeerNode rogue(
            tls_config(make_node_tls(dir.path(), "rogue-ca", "rogue"), {first.address()}));
        rogue.start();
        // Several gossip periods and join retries: nobody learns of anybody across the boundary.
        std::this_thread::sleep_for(1500ms);
        for (PeerNode* node : nodes) {
            CHECK_FALSE(knows(*node, rogue.node_id()));
            CHECK_FALSE(knows(rogue, node->node_id()));
        }
        rogue.kill();
    }
    SECTION("a caller without TLS cannot even open a connection, whatever it sends") {
        const NodeIdentity identity = NodeIdentity::generate();
        SwarmAuth auth(read_file(dir.path() / "swarm-ca.pem"), identity);
        auto stub = v1::Peer::NewStub(
            grpc::CreateChannel(first.address(), grpc::InsecureChannelCredentials()));
        v1::PingRequest request;
        request.set_target_id(first.node_id());
        v1::PingResponse response;
        grpc::ClientContext context;
        context.set_deadline(std::chrono::system_clock::now() + 2s);
        auth.attach(context, "Ping");
        CHECK(stub->Ping(&context, request, &response).error_code() ==
              grpc::StatusCode::UNAVAILABLE);
    }
    // The swarm carries on.
    wait_for("every member alive", 20000ms, [&] { return all_see_all_alive(nodes); });
}

TEST_CASE("TLS settings that cannot work are named") {
    TempDir dir;
    make_ca(dir.path(), "swarm-ca");
    TlsConfig tls = make_node_tls(dir.path(), "swarm-ca", "a");
    SECTION("a certificate without its key") {
        tls.key.clear();
        REQUIRE_THROWS_WITH(PeerNode(tls_config(tls, {})),
                            Catch::Contains("peer.tls_key is not set"));
    }
    SECTION("a CA file that is not there") {
        tls.ca = dir.path() / "missing.pem";
        REQUIRE_THROWS_WITH(PeerNode(tls_config(tls, {})),
                            Catch::Contains("peer.tls_ca") && Catch::Contains("missing.pem"));
    }
    SECTION("a key that is not the certificate's, or a CA that did not sign it") {
        const TlsConfig other = make_node_tls(dir.path(), "swarm-ca", "b");
        TlsConfig crossed = tls;
        crossed.key = other.key;
        REQUIRE_THROWS_WITH(
            PeerNode(tls_config(crossed, {})),
            Catch::Contains("b.key") && Catch::Contains("is not the key of the certificate"));
        make_ca(dir.path(), "other-ca");
        crossed = tls;
        crossed.ca = dir.path() / "other-ca.pem";
        REQUIRE_THROWS_WITH(PeerNode(tls_config(crossed, {})),
                            Catch::Contains("does not verify against") &&
                                Catch::Contains("unable to get local issuer"));
    }
    SECTION("neither TLS nor a swarm secret") {
        REQUIRE_THROWS_WITH(PeerNode(tls_config(TlsConfig{}, {})),
                            Catch::Contains("swarm_secret is empty"));
    }
}

TEST_CASE(
    "a running node's certificates are replaced on reload, and a set that would not work is refused") {
    TempDir dir;
    make_ca(dir.path(), "old-ca");
    make_ca(dir.path(), "new-ca");
    make_ca(dir.path(), "rogue-ca");
    // Mid-rotation, nodes trust both CAs; the swarm secret keeps the key the same on both sides.
    write_file_atomic(dir.path() / "both.pem",
                      read_file(dir.path() / "old-ca.pem") + read_file(dir.path() / "new-ca.pem"));
    const auto rotated = [&](const std::string& node) {
        TlsConfig tls = make_node_tls(dir.path(), "new-ca", node);
        tls.ca = dir.path() / "both.pem";
        return tls;
    };
    const auto config = [](const TlsConfig& tls, const std::vector<std::string>& seeds) {
        PeerConfig c = tls_config(tls, seeds);
        c.swarm_secret = "rotation test";
        return c;
    };
    PeerNode a(config(make_node_tls(dir.path(), "old-ca", "a"), {}));
    a.start();
    // b's certificate is from the new CA, which a does not trust yet: b gets nowhere.
    PeerNode b(config(rotated("b"), {a.address()}));
    b.start();
    std::this_thread::sleep_for(1500ms);
    REQUIRE_FALSE(knows(a, b.node_id()));

    SECTION("a key that is not the certificate's is refused, and the old files stay in use") {
        TlsConfig wrong = rotated("a2");
        wrong.key = dir.path() / "b.key";
        REQUIRE_THROWS_WITH(a.reload_tls(wrong),
                            Catch::Contains("peer.tls_key") &&
                                Catch::Contains("is not the key of the certificate"));
    }
    SECTION("a certificate the CA bundle does not sign is refused") {
        TlsConfig foreign = make_node_tls(dir.path(), "rogue-ca", "a3");
        foreign.ca = dir.path() / "both.pem";
        REQUIRE_THROWS_WITH(a.reload_tls(foreign), Catch::Contains("does not verify against") &&
                                                       Catch::Contains("both.pem"));
    }
    SECTION("TLS is not turned off by a reload") {
        REQUIRE_THROWS_WITH(a.reload_tls(TlsConfig{}), Catch::Contains("restart"));
    }
    std::this_thread::sleep_for(1500ms);
    REQUIRE_FALSE(knows(a, b.node_id()));

    // The rotation proper: a trusts both CAs and presents a new-CA certificate from now on.
    a.reload_tls(rotated("a"));
    const auto took = wait_for("b joins a after a's reload", 5000ms, [&] {
        return all_see_all_alive({&a, &b});
    });
    WARN("b joined " << took.count() << " ms after a's certificates were replaced");
    // A node that trusts the new CA alone reaches a too: a presents the new certificate.
    TlsConfig new_only = make_node_tls(dir.path(), "new-ca", "c");
    PeerNode c(config(new_only, {a.address()}));
    c.start();
    wait_for("c joins", 20000ms, [&] { return all_see_all_alive({&a, &b, &c}); });
}
