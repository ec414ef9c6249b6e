// The relay's rate cap (peer/relay_pacer.h), on a clock the test moves: the flows together stay
// within the cap, each gets an even share while it lasts, and a flow alone gets all of it.
#include <catch2/catch.hpp>

#include <memory>

#include "peer/relay_pacer.h"

using namespace starling;
using namespace std::chrono_literals;
using Clock = RelayPacer::SteadyClock;

namespace {

// Sends frames of `bytes` on each flow in turn, each as soon as its flow admits it, until `until`;
// the bytes each flow sent.
std::vector<uint64_t> send_until(std::vector<std::unique_ptr<RelayPacer::Flow>>& flows,
                                 uint64_t bytes, Clock::time_point start, Clock::time_point until) {
    std::vector<uint64_t> sent(flows.size(), 0);
    std::vector<Clock::time_point> ready(flows.size(), start);
    for (;;) {
        // The flow whose next frame leaves first.
        size_t next = 0;
        for (size_t i = 1; i < flows.size(); i++)
            if (ready[i] < ready[next]) next = i;
        const auto leaves = flows[next]->admit(bytes, ready[next]);
        if (leaves >= until) return sent;
        sent[next] += bytes;
        // Its next frame is offered at once; the pacer says when it may go.
        ready[next] = leaves + 1ns;
    }
}

}  // namespace

TEST_CASE("relay pacing: flows share the cap evenly and stay within it together") {
    const double cap = 10e6;  // bytes a second
    RelayPacer pacer(cap);
    const Clock::time_point t0{};
    for (const size_t n : {1u, 2u, 5u}) {
        INFO(n << " flows");
        std::vector<std::unique_ptr<RelayPacer::Flow>> flows;
        for (size_t i = 0; i < n; i++) flows.push_back(std::make_unique<RelayPacer::Flow>(pacer));
        CHECK(pacer.flows() == n);
        const auto sent = send_until(flows, 100'000, t0, t0 + 10s);
        uint64_t total = 0;
        for (const uint64_t s : sent) {
            total += s;
            // An even share: 10 s at cap / n, within a frame.
            CHECK(static_cast<double>(s) <= 10 * cap / static_cast<double>(n) + 100'000);
            CHECK(static_cast<double>(s) >= 10 * cap / static_cast<double>(n) - 100'000);
        }
        CHECK(static_cast<double>(total) <= 10 * cap + static_cast<double>(n) * 100'000);
    }
    CHECK(pacer.flows() == 0);
}

TEST_CASE(
    "relay pacing: a flow's first frame leaves at once, the next after its bytes at the share") {
    RelayPacer pacer(1e6);
    const Clock::time_point t0{};
    RelayPacer::Flow first(pacer);
    CHECK(first.admit(500'000, t0) == t0);
    CHECK(first.admit(500'000, t0) == t0 + 500ms);
    {
        // A second flow halves the first's share from its next frame on.
        RelayPacer::Flow second(pacer);
        CHECK(second.admit(100'000, t0 + 1s) == t0 + 1s);
        CHECK(first.admit(100'000, t0 + 1s) == t0 + 1s);
        CHECK(first.admit(100'000, t0 + 1s) == t0 + 1200ms);
    }
    // Alone again: the whole cap.
    CHECK(first.admit(100'000, t0 + 1s) == t0 + 1400ms);
    CHECK(first.admit(100'000, t0 + 1s) == t0 + 1500ms);
}
