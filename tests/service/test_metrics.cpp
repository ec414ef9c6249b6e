// NodeMetrics (daemon/service/metrics.h) as a scrape reads it: build info, one phase at a time,
// failure counters that follow running totals, and the process_* figures against what /proc and
// getrlimit say independently.
#include <sys/resource.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <ctime>
#include <fstream>
#include <string>
#include <vector>

#include "daemon/service/metrics.h"
#include "daemon/service/process_metrics.h"
#include "tests/support/metrics_text.h"

using namespace starling;
using starling::test::metric_families;
using starling::test::sample_value;

namespace {

double process_figure(const std::string& name) {
    for (const prometheus::MetricFamily& f : process_metric_families())
        if (f.name == name)
            return f.type == prometheus::MetricType::Counter ? f.metric[0].counter.value
                                                             : f.metric[0].gauge.value;
    FAIL("no " << name);
    return 0;
}

}  // namespace

TEST_CASE(
    "NodeMetrics labels the build, keeps one phase at 1 and follows the failure totals upwards only") {
    NodeMetrics metrics("127.0.0.1:0");
    v1::NodeStatus identity;
    identity.set_node_id("0123456789abcdef");
    identity.set_swarm_id("test-swarm");
    identity.set_version("9.9.9");
    identity.set_model_fingerprint("f00d");
    identity.set_total_steps(1000);
    identity.set_round(7);
    identity.set_inner_step(56);
    metrics.record_identity(identity);
    std::string text = metrics.scrape();
    INFO(text);
    const std::string build =
        R"(starling_build_info{fingerprint="f00d",node="0123456789abcdef",swarm="test-swarm",version="9.9.9"})";
    CHECK(sample_value(text, build) == 1.0);
    CHECK(sample_value(text, "starling_train_steps_target") == 1000.0);
    CHECK(sample_value(text, "starling_round") == 7.0);
    CHECK(sample_value(text, "starling_inner_step") == 56.0);
    CHECK(sample_value(text, R"(starling_phase{phase="starting"})") == 1.0);

    metrics.set_phase(v1::NODE_PHASE_EXCHANGING);
    text = metrics.scrape();
    for (const char* phase : {"starting", "joining", "training", "waiting", "done", "draining"})
        CHECK(sample_value(text, std::string("starling_phase{phase=\"") + phase + "\"}") == 0.0);
    CHECK(sample_value(text, R"(starling_phase{phase="exchanging"})") == 1.0);

    FailureCounts totals{};
    totals[static_cast<size_t>(FailureReason::Timeout)] = 3;
    totals[static_cast<size_t>(FailureReason::Checkpoint)] = 1;
    metrics.record_failures(totals);
    totals[static_cast<size_t>(FailureReason::Timeout)] =
        2;  // a total never falls; the counter must not either
    totals[static_cast<size_t>(FailureReason::Auth)] = 5;
    metrics.record_failures(totals);
    text = metrics.scrape();
    CHECK(sample_value(text, R"(starling_failures_total{reason="auth"})") == 5.0);
    CHECK(sample_value(text, R"(starling_failures_total{reason="timeout"})") == 3.0);
    CHECK(sample_value(text, R"(starling_failures_total{reason="connection"})") == 0.0);
    CHECK(sample_value(text, R"(starling_failures_total{reason="refused_message"})") == 0.0);
    CHECK(sample_value(text, R"(starling_failures_total{reason="state_sync"})") == 0.0);
    CHECK(sample_value(text, R"(starling_failures_total{reason="checkpoint"})") == 1.0);

    SwarmRound round;
    round.tokens = 256;
    round.bytes_sent = 100;
    round.bytes_received = 90;
    round.inner_seconds = 1.25;
    metrics.record_round(round, 8, 64, 400);
    metrics.record_round(round, 9, 72, 400);
    text = metrics.scrape();
    CHECK(sample_value(text, "starling_train_tokens_total") == 512.0);
    CHECK(sample_value(text, "starling_train_seconds_total") == 2.5);
    CHECK(sample_value(text, "starling_exchange_sent_bytes_total") == 200.0);
    CHECK(sample_value(text, "starling_exchange_received_bytes_total") == 180.0);
    CHECK(sample_value(text, "starling_compression_ratio") == 4.0);
    CHECK(metric_families(text).at("process_resident_memory_bytes") == "gauge");
    CHECK(metric_families(text).at("process_cpu_seconds_total") == "counter");
}

TEST_CASE("the process figures agree with /proc/self/status, getrlimit and the clock") {
    std::ifstream status("/proc/self/status");
    double rss_kib = 0;
    for (std::string line; std::getline(status, line);)
        if (line.rfind("VmRSS:", 0) == 0) rss_kib = std::stod(line.substr(6));
    REQUIRE(rss_kib > 0);
    const double rss = process_figure("process_resident_memory_bytes");
    CHECK(rss > 0.5 * rss_kib * 1024);
    CHECK(rss < 2.0 * rss_kib * 1024);
    CHECK(process_figure("process_virtual_memory_bytes") >= rss);

    // Spin until the kernel's own count (the reference) has 0.3 s more, however busy the machine:
    // the exported figure must have moved by most of that.
    const double cpu_before = process_figure("process_cpu_seconds_total");
    const auto cpu_seconds = [] {
        timespec now{};
        clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &now);
        return static_cast<double>(now.tv_sec) + 1e-9 * static_cast<double>(now.tv_nsec);
    };
    const double spin_from = cpu_seconds();
    volatile uint64_t spins = 0;
    while (cpu_seconds() - spin_from < 0.3) spins = spins + 1;
    CHECK(process_figure("process_cpu_seconds_total") - cpu_before >= 0.2);

    rlimit limit{};
    REQUIRE(getrlimit(RLIMIT_NOFILE, &limit) == 0);
    CHECK(process_figure("process_max_fds") == static_cast<double>(limit.rlim_cur));
    const int extra = dup(0);
    const double open_with_extra = process_figure("process_open_fds");
    close(extra);
    CHECK(process_figure("process_open_fds") == open_with_extra - 1);

    const double now =
        std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
    const double started = process_figure("process_start_time_seconds");
    CHECK(started <= now + 1);
    CHECK(started > now - 24 * 3600);  // a test process is younger than a day
}

TEST_CASE("figures with no value yet are absent from /metrics until their first value") {
    // A 0 before the first evaluation made min_over_time(starling_val_loss[6h]) 0, and the
    // validation-loss alert fired on every healthy node for six hours after each start.
    NodeMetrics metrics("127.0.0.1:0");
    const std::vector<std::string> position = {"starling_build_info", "starling_round",
                                               "starling_inner_step",
                                               "starling_train_steps_target"};
    const std::vector<std::string> later = {"starling_train_loss",
                                            "starling_val_loss",
                                            "starling_tokens_per_second",
                                            "starling_compression_ratio",
                                            "starling_partner_distance",
                                            "starling_checkpoint_round",
                                            "starling_checkpoint_timestamp_seconds"};
    const auto absent = [](const std::string& text, const std::string& name) {
        INFO(name);
        CHECK_FALSE(sample_value(text, name).has_value());
        CHECK(metric_families(text).count(name) == 0);  // no HELP or TYPE line either
    };
    // Before the node has loaded its state: a resumed node's round is not 0, so there is none.
    std::string text = metrics.scrape();
    INFO(text);
    for (const std::string& name : position) absent(text, name);
    for (const std::string& name : later) absent(text, name);
    CHECK(sample_value(text, R"(starling_phase{phase="starting"})") == 1.0);

    v1::NodeStatus identity;
    identity.set_total_steps(1000);
    identity.set_round(500);
    identity.set_inner_step(4000);
    metrics.record_identity(identity);
    text = metrics.scrape();
    CHECK(sample_value(text, "starling_round") == 500.0);
    CHECK(sample_value(text, "starling_inner_step") == 4000.0);
    CHECK(sample_value(text, "starling_train_steps_target") == 1000.0);
    for (const std::string& name : later) absent(text, name);

    // A solo round: a loss and a pace, but no exchange and no partner yet.
    SwarmRound solo;
    solo.train_loss = 2.5;
    solo.tokens = 256;
    solo.inner_seconds = 0.5;
    metrics.record_round(solo, 1, 8, 400);
    text = metrics.scrape();
    CHECK(sample_value(text, "starling_train_loss") == 2.5);
    CHECK(sample_value(text, "starling_tokens_per_second") == 512.0);
    CHECK_FALSE(sample_value(text, "starling_compression_ratio").has_value());
    CHECK_FALSE(sample_value(text, "starling_partner_distance").has_value());
    CHECK_FALSE(sample_value(text, "starling_val_loss").has_value());

    SwarmRound paired = solo;
    paired.solo = false;
    paired.partner = 42;
    paired.bytes_sent = 100;
    paired.partner_distance = 0.125;
    metrics.record_round(paired, 2, 16, 400);
    metrics.record_val_loss(1.875);
    metrics.record_checkpoint(2);
    metrics.record_val_loss(1.75);  // later values replace the first
    text = metrics.scrape();
    CHECK(sample_value(text, "starling_compression_ratio") == 4.0);
    CHECK(sample_value(text, "starling_partner_distance") == 0.125);
    CHECK(sample_value(text, "starling_val_loss") == 1.75);
    CHECK(sample_value(text, "starling_checkpoint_round") == 2.0);
    const double now =
        std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
    const auto written = sample_value(text, "starling_checkpoint_timestamp_seconds");
    REQUIRE(written.has_value());
    CHECK(*written > now - 60);
    CHECK(*written <= now + 1);
    for (const std::string& name : later) CHECK(metric_families(text).at(name) == "gauge");
}
