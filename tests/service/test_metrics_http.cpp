// The /metrics endpoint (daemon/service/metrics_http.h) over real sockets on 127.0.0.1: a scrape
// gets the body, other paths and methods get their status, and a request that never ends or
// overflows the head limit costs a closed connection, never the server.
#include <catch2/catch.hpp>

#include <asio.hpp>

#include <string>

#include "common/error.h"
#include "daemon/service/metrics_http.h"

using namespace starling;

namespace {

// Sends `request` and returns everything the server answers until it closes.
std::string exchange(uint16_t port, const std::string& request) {
    asio::io_context io;
    asio::ip::tcp::socket socket(io);
    socket.connect({asio::ip::make_address("127.0.0.1"), port});
    // A server that drops the request may reset the connection while it is still being written.
    asio::error_code error;
    asio::write(socket, asio::buffer(request), error);
    std::string answer;
    asio::read(socket, asio::dynamic_buffer(answer), error);  // until the server closes
    return answer;
}

}  // namespace

TEST_CASE("GET /metrics returns the body, other paths 404 and other methods 405") {
    int scrapes = 0;
    MetricsHttpServer server("127.0.0.1:0",
                             [&] { return "m " + std::to_string(++scrapes) + "\n"; });
    REQUIRE(server.port() != 0);
    const std::string ok = exchange(server.port(), "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
    CHECK(ok.starts_with("HTTP/1.1 200 OK\r\n"));
    CHECK(ok.find("Content-Length: 4\r\n") != std::string::npos);
    CHECK(ok.ends_with("\r\n\r\nm 1\n"));
    CHECK(exchange(server.port(), "GET /other HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 404"));
    CHECK(exchange(server.port(), "POST /metrics HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 405"));
    CHECK(scrapes == 1);
}

TEST_CASE("an oversized request head is dropped and the server keeps answering") {
    MetricsHttpServer server("127.0.0.1:0", [] { return std::string("fine\n"); });
    const std::string flood = "GET /metrics HTTP/1.1\r\nX: " + std::string(100000, 'a');
    CHECK(exchange(server.port(), flood).empty());
    CHECK(exchange(server.port(), "GET /metrics HTTP/1.0\r\n\r\n").ends_with("fine\n"));
}

TEST_CASE("an address that cannot be served is refused, naming it") {
    CHECK_THROWS_WITH(MetricsHttpServer("no-port-here", [] { return std::string(); }),
                      Catch::Contains("\"no-port-here\" is not HOST:PORT"));
    MetricsHttpServer taken("127.0.0.1:0", [] { return std::string(); });
    const std::string address = "127.0.0.1:" + std::to_string(taken.port());
    CHECK_THROWS_WITH(MetricsHttpServer(address, [] { return std::string(); }),
                      Catch::Contains("cannot serve /metrics on " + address));
}
