// The control port's gate in front of a real gRPC server (the standard health service) on
// 127.0.0.1: real calls pass both ways, and a rapid reset, a breach of HTTP/2 or one connection
// too many is closed without touching the others.
#include <grpcpp/grpcpp.h>

#include <catch2/catch.hpp>
#include <thread>

#include "daemon/service/control_gate.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "tests/support/http2_flood.h"
#include "tests/support/raw_tcp.h"

using namespace starling;
using namespace starling::test;
using namespace std::chrono_literals;

namespace {

// grpc.health.v1.Health on gRPC's sync server, as the control server's services are.
class AlwaysServing final : public grpc::health::v1::Health::Service {
    grpc::Status Check(grpc::ServerContext*, const grpc::health::v1::HealthCheckRequest*,
                       grpc::health::v1::HealthCheckResponse* response) override {
        response->set_status(grpc::health::v1::HealthCheckResponse::SERVING);
        return grpc::Status::OK;
    }
};

class GatedServer {
public:
    explicit GatedServer(ControlLimits limits = {}) : gate_("127.0.0.1:0", limits) {
        grpc::ServerBuilder builder;
        builder.RegisterService(&health_);
        auto acceptor = builder.experimental().AddExternalConnectionAcceptor(
            grpc::ServerBuilder::experimental_type::ExternalConnectionType::FROM_FD,
            grpc::InsecureServerCredentials());
        server_ = builder.BuildAndStart();
        REQUIRE(server_);
        gate_.start(std::move(acceptor));
    }
    ~GatedServer() {
        gate_.stop_reading();
        server_->Shutdown(std::chrono::system_clock::now() + 1s);
        gate_.stop();
    }

    ControlGate& gate() { return gate_; }
    uint16_t port() const { return gate_.port(); }
    std::shared_ptr<grpc::Channel> channel() const {
        return grpc::CreateChannel("127.0.0.1:" + std::to_string(port()),
                                   grpc::InsecureChannelCredentials());
    }

private:
    AlwaysServing health_;
    ControlGate gate_;
    std::unique_ptr<grpc::Server> server_;
};

bool serving(const std::shared_ptr<grpc::Channel>& channel) {
    auto stub = grpc::health::v1::Health::NewStub(channel);
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + 10s);
    grpc::health::v1::HealthCheckRequest request;
    grpc::health::v1::HealthCheckResponse response;
    return stub->Check(&context, request, &response).ok() &&
           response.status() == grpc::health::v1::HealthCheckResponse::SERVING;
}

void wait_until(const char* what, const std::function<bool()>& done) {
    const auto until = std::chrono::steady_clock::now() + 20s;
    while (!done()) {
        INFO(what);
        REQUIRE(std::chrono::steady_clock::now() < until);
        std::this_thread::sleep_for(20ms);
    }
}

}  // namespace

TEST_CASE("the control gate passes gRPC calls and their answers both ways") {
    GatedServer server;
    const auto shared = server.channel();
    for (int i = 0; i < 20; i++) CHECK(serving(shared));
    for (int i = 0; i < 5; i++) CHECK(serving(server.channel()));
    CHECK(server.gate().closed() == 0);
}

TEST_CASE("the control gate closes a connection that resets streams past its budget") {
    ControlLimits limits;
    limits.reset_burst = 16;
    limits.resets_per_second = 1;
    GatedServer server(limits);

    // Within the budget: a client may cancel calls.
    const RawConnection calm(server.port());
    REQUIRE(calm.send(rapid_reset_bytes(10)));
    CHECK_FALSE(calm.closed_within(300ms));

    const RawConnection flood(server.port());
    REQUIRE(flood.send(rapid_reset_bytes(200)));
    CHECK(flood.closed_within(10000ms));
    CHECK(server.gate().closed() == 1);
    CHECK_FALSE(calm.closed_within(10ms));
    CHECK(serving(server.channel()));
}

TEST_CASE("the control gate closes a connection that breaks HTTP/2") {
    GatedServer server;
    const RawConnection stream_zero(server.port());
    std::string bytes = rapid_reset_bytes(0);
    // HEADERS (END_HEADERS) on stream 0, with the first byte of a request's HPACK.
    bytes += std::string("\0\0\1\1\4\0\0\0\0\x83", 10);
    REQUIRE(stream_zero.send(bytes));
    CHECK(stream_zero.closed_within(10000ms));

    const RawConnection not_http2(server.port());
    REQUIRE(not_http2.send("GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n"));
    CHECK(not_http2.closed_within(10000ms));
    CHECK(server.gate().closed() == 2);
    CHECK(serving(server.channel()));
}

TEST_CASE("the control gate closes a connection past its cap, and takes one again once one ends") {
    ControlLimits limits;
    limits.max_connections = 3;
    GatedServer server(limits);
    std::vector<std::unique_ptr<RawConnection>> held;
    for (int i = 0; i < 3; i++) held.push_back(std::make_unique<RawConnection>(server.port()));
    const RawConnection fourth(server.port());
    CHECK(fourth.closed_within(10000ms));
    for (const auto& connection : held) CHECK_FALSE(connection->closed_within(10ms));
    CHECK(server.gate().closed() == 1);

    held.pop_back();
    // The gate sees the end of the one let go when it reads it; a new caller gets its place.
    wait_until("a call through the freed place", [&] { return serving(server.channel()); });
}

TEST_CASE("the control gate holds new streams past the budget of all connections back") {
    ControlLimits limits;
    limits.streams_per_second = 5;
    limits.stream_burst = 5;
    GatedServer server(limits);
    const auto channel = server.channel();
    // 5 streams at once, then 10 more at 5 a second: 2 s at the least, however fast the machine.
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < 15; i++) CHECK(serving(channel));
    CHECK(std::chrono::steady_clock::now() - start >= 1900ms);
    CHECK(server.gate().closed() == 0);
}
