// HTTP/2 rapid reset (CVE-2023-44487: streams opened and reset at once, as fast as a socket takes
// them) against a real starlingd, on its control port and on its peer port: the node's threads
// and memory stay bounded while it lasts, the node answers afterwards,
// and SIGTERM in the middle of it ends the node within the drain bound.
#include <signal.h>

#include <catch2/catch.hpp>
#include <fstream>
#include <sstream>
#include <thread>

#include "tests/integration/daemon_harness.h"
#include "tests/support/files.h"
#include "tests/support/http2_flood.h"
#include "tests/support/metrics_text.h"
#include "tests/support/sanitizer.h"

using namespace starling;
using namespace starling::test;
using namespace std::chrono_literals;

namespace {

struct Usage {
    long threads = 0;
    long rss_kb = 0;
};

Usage usage_of(pid_t pid) {
    std::ifstream status("/proc/" + std::to_string(pid) + "/status");
    Usage usage;
    for (std::string line; std::getline(status, line);) {
        std::istringstream fields(line);
        std::string key;
        fields >> key;
        if (key == "Threads:") fields >> usage.threads;
        if (key == "VmRSS:") fields >> usage.rss_kb;
    }
    return usage;
}

uint16_t port_of(const std::string& address) {
    return static_cast<uint16_t>(std::stoi(address.substr(address.rfind(':') + 1)));
}

// Two attackers on `port` while `watch` runs; returns the most threads and memory seen.
template <typename Watch>
Usage under_rapid_reset(pid_t pid, uint16_t port, Watch watch) {
    std::atomic<bool> stop{false};
    std::vector<std::thread> attackers;
    for (int i = 0; i < 2; i++) attackers.emplace_back([&] { rapid_reset_until(port, stop); });
    Usage peak;
    std::atomic<bool> watching{true};
    std::thread sampler([&] {
        while (watching) {
            const Usage now = usage_of(pid);
            peak.threads = std::max(peak.threads, now.threads);
            peak.rss_kb = std::max(peak.rss_kb, now.rss_kb);
            std::this_thread::sleep_for(50ms);
        }
    });
    watch();
    stop = true;
    watching = false;
    for (auto& t : attackers) t.join();
    sampler.join();
    return peak;
}

}  // namespace

TEST_CASE(
    "HTTP/2 rapid reset on the control or the peer port leaves the node's threads and memory "
    "bounded, and SIGTERM during it ends the node",
    "[integration]") {
    const bool control = GENERATE(true, false);
    INFO((control ? "control port" : "peer port"));
    TempDir root;
    TestDaemon a("a", root.path());
    a.start();
    eventually("a answers", 30s, [&] { return a.cli({"status"}).status == 0; });
    const pid_t pid = a.process().pid();
    const Usage before = usage_of(pid);
    const uint16_t port = port_of(control ? a.control_address() : a.peer_address());

    // Long enough for thousands of streams per second to pile up where nothing bounds them.
    const Usage peak = under_rapid_reset(pid, port, [] { std::this_thread::sleep_for(5s); });
    INFO("threads " << before.threads << " -> " << peak.threads << ", RSS " << before.rss_kb
                    << " -> " << peak.rss_kb << " kB");
    CHECK(peak.threads <= before.threads + 32);
    // The peer port ends a stranger's connection in the TLS handshake; the control port's gate
    // closes a connection that resets streams past its budget.
    // (Under a sanitizer, whose quarantine holds freed memory back, RSS says nothing of that.)
    if (!test::kSanitizerAllocator) CHECK(peak.rss_kb <= 2 * before.rss_kb);
    eventually("a answers after the flood", 30s, [&] { return a.cli({"status"}).status == 0; });
    if (control) {
        // The gate's closures show on /metrics (the tick copies them once a second).
        eventually("/metrics counts the connections the control gate closed", 10s, [&] {
            return sample_value(http_get(a.metrics_port(), "/metrics"),
                                "starling_control_connections_closed_total")
                       .value_or(0.0) >= 1.0;
        });
    }

    std::optional<int> exit_status;
    under_rapid_reset(pid, port, [&] {
        std::this_thread::sleep_for(1s);
        a.process().signal(SIGTERM);
        exit_status = a.process().wait(30s);
    });
    CHECK(exit_status == 0);
}
