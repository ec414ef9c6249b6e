// Hole punching's parts on loopback (peer/hole_punch.h): a peer port's answer to an observe
// request, two punch ports connecting by simultaneous open, and the punches that must fail. The
// punch through real NATs runs in tests/nat/reachability.py --relay.
#include <catch2/catch.hpp>
#include <sys/socket.h>

#include <array>
#include <chrono>
#include <future>
#include <string>

#include "common/error.h"
#include "peer/connection_gate.h"
#include "peer/hole_punch.h"

using namespace starling;
using namespace std::chrono_literals;

namespace {

std::string loopback(uint16_t port) { return "127.0.0.1:" + std::to_string(port); }

// Both ports punch to each other at once; their connections, or the errors they threw.
struct PunchedPair {
    UniqueFd a, b;
    std::string a_error, b_error;
};

PunchedPair punch_both(PunchPort& a, PunchPort& b, uint64_t a_greets_b_as = 2) {
    const auto deadline = std::chrono::steady_clock::now() + 5s;
    const auto one_side = [deadline](PunchPort& from, const PunchPort& to, uint64_t self,
                                     uint64_t partner, std::string* error) {
        try {
            return from.punch(loopback(to.port()), self, partner, deadline);
        } catch (const Error& e) {
            *error = e.what();
            return UniqueFd();
        }
    };
    PunchedPair pair;
    auto b_side =
        std::async(std::launch::async, [&] { return one_side(b, a, 2, 1, &pair.b_error); });
    pair.a = one_side(a, b, 1, a_greets_b_as, &pair.a_error);
    pair.b = b_side.get();
    return pair;
}

uint16_t far_port(const UniqueFd& fd) {
    sockaddr_storage address{};
    socklen_t length = sizeof(address);
    REQUIRE(::getpeername(fd.get(), reinterpret_cast<sockaddr*>(&address), &length) == 0);
    return ntohs(reinterpret_cast<const sockaddr_in&>(address).sin_port);
}

}  // namespace

TEST_CASE("the peer port tells a caller the address and port its connection came from") {
    CHECK(observe_answer({asio::ip::make_address("::ffff:10.1.2.3"), 7700}) == "10.1.2.3:7700\n");
    CHECK(observe_answer({asio::ip::make_address("192.0.2.9"), 1}) == "192.0.2.9:1\n");
    CHECK(observe_answer({asio::ip::make_address("2001:db8::1"), 80}) == "[2001:db8::1]:80\n");

    ConnectionGate gate("127.0.0.1:0", {});
    gate.start(nullptr);
    PunchPort port;
    REQUIRE(port.port() != 0);
    CHECK(port.observe(loopback(gate.port()), 2000ms) == loopback(port.port()));
    // Again from the same port: the first connection's end does not stand in the way.
    CHECK(port.observe(loopback(gate.port()), 2000ms) == loopback(port.port()));
    CHECK_THROWS_WITH(port.observe("nonsense", 500ms), Catch::Contains("is not host:port"));
}

TEST_CASE("two punch ports connect to each other, and the connection links the two") {
    PunchPort a, b;
    const PunchedPair pair = punch_both(a, b);
    INFO(pair.a_error << " / " << pair.b_error);
    REQUIRE(pair.a);
    REQUIRE(pair.b);
    CHECK(far_port(pair.a) == b.port());
    CHECK(far_port(pair.b) == a.port());
    const std::string sent = "after the greetings, the bytes are the caller's";
    REQUIRE(::send(pair.a.get(), sent.data(), sent.size(), MSG_NOSIGNAL) ==
            static_cast<ssize_t>(sent.size()));
    std::array<char, 64> got{};
    size_t have = 0;
    while (have < sent.size()) {
        const ssize_t n = ::recv(pair.b.get(), got.data() + have, got.size() - have, 0);
        if (n > 0)
            have += static_cast<size_t>(n);
        else if (errno != EAGAIN && errno != EINTR)
            break;
    }
    CHECK(std::string(got.data(), have) == sent);
    // The port serves the next punch too.
    PunchPort c;
    const PunchedPair again = punch_both(a, c);
    CHECK(again.a);
    CHECK(again.b);
}

TEST_CASE(
    "a punch fails by its deadline, naming why, when the partner is not punching or not "
    "the one expected") {
    PunchPort a, b;
    SECTION("nobody punching at the far port") {
        const auto started = std::chrono::steady_clock::now();
        CHECK_THROWS_WITH(a.punch(loopback(b.port()), 1, 2, started + 1500ms),
                          Catch::Contains("no connection from port " + std::to_string(a.port())) &&
                              Catch::Contains("attempt(s)"));
        CHECK(std::chrono::steady_clock::now() - started < 4s);
    }
    SECTION("a greeting that names another node") {
        const PunchedPair pair = punch_both(a, b, 3);
        CHECK_FALSE(pair.a);
        CHECK_FALSE(pair.b);
        CHECK_THAT(pair.a_error, Catch::Contains("greeting"));
    }
    SECTION("a name where an address must be") {
        CHECK_THROWS_WITH(a.punch("localhost:" + std::to_string(b.port()), 1, 2,
                                  std::chrono::steady_clock::now() + 1s),
                          Catch::Contains("IPv4"));
    }
    SECTION("cancelled") {
        const std::atomic<bool> cancelled{true};
        CHECK_THROWS_WITH(
            a.punch(loopback(b.port()), 1, 2, std::chrono::steady_clock::now() + 5s, &cancelled),
            Catch::Contains("stopped"));
    }
}

TEST_CASE("a partner a punch failed to is left out of punching for a while, then tried again") {
    PunchFailures failures;
    const std::chrono::steady_clock::time_point t0{std::chrono::hours(1)};
    CHECK(failures.may_punch(7, t0));
    failures.failed(7, t0);
    CHECK_FALSE(failures.may_punch(7, t0));
    CHECK_FALSE(failures.may_punch(7, t0 + PunchFailures::kRetryAfter - 1s));
    CHECK(failures.may_punch(8, t0));  // another partner is not held back
    CHECK(failures.may_punch(7, t0 + PunchFailures::kRetryAfter));
    // Tried again and failed again: another wait from that failure.
    failures.failed(7, t0 + PunchFailures::kRetryAfter);
    CHECK_FALSE(failures.may_punch(7, t0 + PunchFailures::kRetryAfter + 1s));
}
