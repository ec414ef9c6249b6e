#include <catch2/catch.hpp>

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <thread>

#include "cli/control_client.h"
#include "tests/cli/fake_control.h"

using namespace starling;
using namespace starling::cli;

namespace {

// A port of 127.0.0.1 that nothing listens on: bound by the kernel's choice, then released.
std::string closed_address() {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    REQUIRE(fd >= 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0);
    socklen_t size = sizeof(address);
    REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &size) == 0);
    ::close(fd);
    return "127.0.0.1:" + std::to_string(ntohs(address.sin_port));
}

}  // namespace

TEST_CASE("seeds must be host:port with a port of 1-65535") {
    for (const char* good :
         {"10.0.0.2:7700", "node-3.example:1", "localhost:65535", "[::1]:7700", "[fe80::1]:80"}) {
        INFO(good);
        CHECK(is_seed_address(good));
    }
    for (const char* bad :
         {"", "notaport", "host:", ":7700", "host:0", "host:65536", "host:-1", "host:+80",
          "host:7x", "host:80 ", "a b:80", "::1:7700", "[::1]", "[]:80", "host:99999999999"}) {
        INFO(bad);
        CHECK_FALSE(is_seed_address(bad));
    }
}

TEST_CASE("a control address is host:port or a gRPC target with its scheme") {
    for (const char* good :
         {"127.0.0.1:7701", "localhost:7701", "[::1]:7701", "unix:/run/starling/control.sock",
          "unix:relative.sock", "dns:///node-3.example:7701", "ipv4:127.0.0.1:7701"}) {
        INFO(good);
        CHECK(is_control_address(good));
    }
    for (const char* bad :
         {"", "unix:", "garbage", "127.0.0.1", "127.0.0.1:99999", "127.0.0.1:0"}) {
        INFO(bad);
        CHECK_FALSE(is_control_address(bad));
    }
}

TEST_CASE("a call's status maps to the exit status and message every command shares") {
    const grpc::Status unavailable(grpc::StatusCode::UNAVAILABLE,
                                   "failed to connect to all addresses");
    const grpc::Status late(grpc::StatusCode::DEADLINE_EXCEEDED, "Deadline Exceeded");
    const grpc::Status refused(grpc::StatusCode::FAILED_PRECONDITION, "the node is still joining");

    CHECK(exit_code_for(grpc::Status::OK, true) == kExitOk);
    CHECK(exit_code_for(unavailable, true) == kExitUnreachable);
    CHECK(exit_code_for(unavailable, false) == kExitUnreachable);
    CHECK(exit_code_for(late, true) == kExitUnreachable);
    CHECK(exit_code_for(late, false) == kExitError);  // a stream has no deadline of ours
    CHECK(exit_code_for(refused, true) == kExitError);
    CHECK(exit_code_for(grpc::Status::CANCELLED, true) == kExitError);

    CHECK(
        failure_message(unavailable, true, "127.0.0.1:7701") ==
        "error: cannot reach starlingd at 127.0.0.1:7701 (is it running? --control or STARLING_CONTROL)");
    CHECK(failure_message(late, true, "unix:/run/s.sock")
              .find("cannot reach starlingd at unix:/run/s.sock") != std::string::npos);
    CHECK(failure_message(refused, true, "127.0.0.1:7701") == "error: the node is still joining");
    CHECK(failure_message(grpc::Status(grpc::StatusCode::INTERNAL, ""), true, "127.0.0.1:7701") ==
          "error: starlingd at 127.0.0.1:7701 answered with status code 13");
}

TEST_CASE("the control address comes from STARLING_CONTROL, else the default") {
    const char* before = std::getenv("STARLING_CONTROL");
    const std::string saved = before != nullptr ? before : "";
    ::unsetenv("STARLING_CONTROL");
    CHECK(default_control_address() == "127.0.0.1:7701");
    ::setenv("STARLING_CONTROL", "", 1);
    CHECK(default_control_address() == "127.0.0.1:7701");
    ::setenv("STARLING_CONTROL", "unix:/run/starling/control.sock", 1);
    CHECK(default_control_address() == "unix:/run/starling/control.sock");
    if (before != nullptr)
        ::setenv("STARLING_CONTROL", saved.c_str(), 1);
    else
        ::unsetenv("STARLING_CONTROL");
}

TEST_CASE("no node at the address is UNAVAILABLE at once, not a hang") {
    ControlClient client(closed_address());
    const auto start = std::chrono::steady_clock::now();
    v1::NodeStatus status;
    const grpc::Status result = client.get_status(status);
    CHECK(exit_code_for(result, true) == kExitUnreachable);
    CHECK(std::chrono::steady_clock::now() - start <
          ControlClient::kUnaryDeadline + std::chrono::seconds(1));

    grpc::Status watch_status;
    CHECK(client.watch(
              0, 0, [](const v1::NodeStatus&) { FAIL("an update from nowhere"); }, watch_status) ==
          WatchEnd::Failed);
    CHECK(exit_code_for(watch_status, false) == kExitUnreachable);
}

TEST_CASE("unary calls carry the node's answer or its error") {
    test::FakeNode node;
    node.service.status.set_node_id("00112233aabbccdd");
    ControlClient client(node.address());

    v1::NodeStatus status;
    REQUIRE(client.get_status(status).ok());
    CHECK(status.node_id() == "00112233aabbccdd");
    v1::ListPeersResponse peers;
    REQUIRE(client.list_peers(peers).ok());
    CHECK(peers.peers_size() == 1);
    v1::JoinSwarmResponse joined;
    REQUIRE(client.join({"10.0.0.2:7700", "[::1]:7000"}, joined).ok());
    CHECK(joined.seeds_added() == 2);
    CHECK(node.service.seeds_seen == std::vector<std::string>{"10.0.0.2:7700", "[::1]:7000"});
    CHECK(client.leave().ok());

    node.service.unary_result =
        grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "already draining");
    const grpc::Status refused = client.leave();
    CHECK(exit_code_for(refused, true) == kExitError);
    CHECK(failure_message(refused, true, client.address()) == "error: already draining");
}

TEST_CASE("a watch ends after the count, on stop, or when the node ends it") {
    test::FakeNode node;
    ControlClient client(node.address());
    std::vector<uint64_t> rounds;
    const auto collect = [&](const v1::NodeStatus& update) { rounds.push_back(update.round()); };
    grpc::Status status;

    SECTION("after --count updates of an endless stream") {
        CHECK(client.watch(250, 3, collect, status) == WatchEnd::Counted);
        CHECK(rounds == std::vector<uint64_t>{0, 1, 2});
        CHECK(node.service.interval_seen == 250);
    }
    SECTION("when the node finishes the stream") {
        node.service.watch_updates = 2;
        CHECK(client.watch(0, 0, collect, status) == WatchEnd::NodeLeft);
        CHECK(rounds.size() == 2);
        CHECK(status.ok());
    }
    SECTION("when a draining node cancels it") {
        node.service.watch_updates = 2;
        node.service.last_phase = v1::NODE_PHASE_DRAINING;
        node.service.watch_result = grpc::Status::CANCELLED;
        CHECK(client.watch(0, 0, collect, status) == WatchEnd::NodeLeft);
    }
    SECTION("a cancelled stream without a drain is a failure") {
        node.service.watch_updates = 2;
        node.service.watch_result = grpc::Status::CANCELLED;
        CHECK(client.watch(0, 0, collect, status) == WatchEnd::Failed);
        CHECK(exit_code_for(status, false) == kExitError);
    }
    SECTION("with the node's error") {
        node.service.watch_updates = 1;
        node.service.watch_result =
            grpc::Status(grpc::StatusCode::INTERNAL, "status unavailable while loading");
        CHECK(client.watch(0, 0, collect, status) == WatchEnd::Failed);
        CHECK(status.error_message() == "status unavailable while loading");
    }
    SECTION("when stopped from another thread, as Ctrl-C does") {
        std::thread stopper([&] {
            std::this_thread::sleep_for(std::chrono::milliseconds(100));
            client.stop();
        });
        CHECK(client.watch(
                  0, 0, [](const v1::NodeStatus&) {}, status) == WatchEnd::Stopped);
        stopper.join();
        CHECK(client.watch(0, 0, collect, status) ==
              WatchEnd::Stopped);  // a stopped client stays stopped
        CHECK(rounds.empty());
    }
}
