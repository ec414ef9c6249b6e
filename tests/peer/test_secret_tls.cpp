// Mutual TLS made from the swarm secret (peer/secret_tls.h): the certificates check out with the
// openssl command as the reference, and a stranger's bytes end at the TLS handshake, whatever
// HTTP/2 frames they hold, while holders of the secret reach gRPC.
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <grpcpp/create_channel.h>

#include <catch2/catch.hpp>
#include <cstdlib>

#include "common/atomic_file.h"
#include "peer/auth.h"
#include "peer/local_cluster.h"
#include "peer/secret_tls.h"
#include "starling/v1/peer.grpc.pb.h"
#include "tests/peer/cluster_util.h"
#include "tests/support/files.h"
#include "tests/support/http2_flood.h"

using namespace starling;
using namespace starling::test;
using namespace std::chrono_literals;

namespace {

bool openssl_verifies(const std::filesystem::path& dir, const std::string& ca_pem,
                      const std::string& cert_pem) {
    write_file_atomic(dir / "ca.pem", ca_pem);
    write_file_atomic(dir / "cert.pem", cert_pem);
    const std::string command = "openssl verify -CAfile " + (dir / "ca.pem").string() + " " +
                                (dir / "cert.pem").string() + " >/dev/null 2>&1";
    return std::system(command.c_str()) == 0;
}

// Sends `bytes` to 127.0.0.1:port as far as the node takes them, then reads until it closes the
// connection (or 5 s pass); returns what the node sent, and whether it closed.
std::pair<std::string, bool> send_and_read(uint16_t port, const std::string& bytes) {
    const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    REQUIRE(fd >= 0);
    sockaddr_in to{};
    to.sin_family = AF_INET;
    to.sin_port = htons(port);
    to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(connect(fd, reinterpret_cast<const sockaddr*>(&to), sizeof(to)) == 0);
    // A closed connection stops the writing: the rest would only meet a reset.
    (void)send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
    std::string received;
    bool closed = false;
    const auto until = std::chrono::steady_clock::now() + 5s;
    while (!closed && std::chrono::steady_clock::now() < until) {
        pollfd p{fd, POLLIN, 0};
        if (poll(&p, 1, 100) <= 0) continue;
        char buffer[4096];
        const ssize_t n = recv(fd, buffer, sizeof(buffer), 0);
        if (n > 0)
            received.append(buffer, static_cast<size_t>(n));
        else
            closed = true;
    }
    close(fd);
    return {received, closed};
}

uint16_t port_of(const PeerNode& node) {
    return static_cast<uint16_t>(std::stoi(node.address().substr(node.address().rfind(':') + 1)));
}

grpc::StatusCode ping(const std::string& address, const std::string& tls_secret,
                      const SwarmAuth* auth) {
    const auto stub =
        v1::Peer::NewStub(grpc::CreateChannel(address, channel_credentials({}, tls_secret)));
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + 5s);
    if (auth) auth->attach(context, "Ping");
    v1::PingRequest request;
    v1::PingResponse response;
    return stub->Ping(&context, request, &response).error_code();
}

}  // namespace

TEST_CASE("the swarm secret makes one CA, and a node certificate only it verifies") {
    TempDir dir;
    const TlsPem first = tls_from_secret("one swarm's secret");
    const TlsPem again = tls_from_secret("one swarm's secret");
    const TlsPem other = tls_from_secret("another swarm's secret");
    CHECK(first.ca == again.ca);
    CHECK(first.ca != other.ca);
    CHECK(first.key != again.key);  // each node its own key
    CHECK(openssl_verifies(dir.path(), first.ca, first.cert));
    CHECK(openssl_verifies(dir.path(), first.ca, again.cert));
    CHECK_FALSE(openssl_verifies(dir.path(), other.ca, first.cert));
    CHECK_FALSE(openssl_verifies(dir.path(), first.ca, other.cert));
    CHECK_THROWS_WITH(tls_from_secret(""), Catch::Contains("peer.swarm_secret is empty"));
}

TEST_CASE("a stranger's HTTP/2 frames end at the TLS handshake, and holders of the secret get in") {
    LocalCluster cluster(2);
    wait_for("two members", 20000ms, [&] {
        return all_see_all_alive({&cluster.node(0), &cluster.node(1)});
    });
    const std::string address = cluster.node(0).address();
    const std::string secret = local_cluster_config().swarm_secret;

    // A plaintext server would answer the preface with its SETTINGS frame; TLS has nothing but
    // an alert record (0x15) for bytes that are no hello, and closes the connection.
    const auto [received, closed] =
        send_and_read(port_of(cluster.node(0)), rapid_reset_bytes(2000));
    CHECK(closed);
    INFO("the node sent " << received.size() << " bytes");
    CHECK((received.empty() || received[0] == '\x15'));

    const NodeIdentity caller = NodeIdentity::generate();
    const SwarmAuth auth(secret, caller);
    CHECK(ping(address, "another swarm's secret", &auth) == grpc::StatusCode::UNAVAILABLE);
    // Through TLS, gRPC answers: without the call's credentials it refuses, with them it serves.
    CHECK(ping(address, secret, nullptr) == grpc::StatusCode::UNAUTHENTICATED);
    CHECK(ping(address, secret, &auth) == grpc::StatusCode::OK);
    CHECK(all_see_all_alive({&cluster.node(0), &cluster.node(1)}));
}
