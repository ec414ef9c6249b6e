// One member with a mistyped learning rate among honest starlingd processes (the config typo of
// docs/spec.md's sane() and DiLoCo clip): its messages are refused or clipped, and the honest
// nodes keep finite weights and learn. Before those defences one partner's message at a learning
// rate of 1e2 was averaged in during the first rounds, and the honest nodes ended NaN.
#include <catch2/catch.hpp>
#include <cmath>
#include <signal.h>

#include "tests/integration/daemon_harness.h"
#include "tests/support/files.h"

using namespace starling::test;
using namespace std::chrono_literals;

namespace {

constexpr uint64_t kRounds = 40;

// Three honest daemons and one whose [optimizer].lr is `faulty_lr`, all with `method`, evaluated
// every 8 rounds. Each honest node must reach kRounds with a finite validation loss and a training
// loss well below its first; returns the honest nodes' logs joined.
std::string run_with_faulty_member(const std::string& method, const std::string& faulty_lr) {
    TempDir root;
    TestDaemon a("a", root.path()), b("b", root.path()), c("c", root.path()),
        faulty("faulty", root.path());
    const Environment honest{{"STARLING_SWARM_METHOD", method}, {"STARLING_SWARM_EVAL_EVERY", "8"}};
    Environment typo = honest;
    typo["STARLING_OPTIMIZER_LR"] = faulty_lr;
    a.start({}, honest);
    b.start({a.peer_address()}, honest);
    c.start({a.peer_address()}, honest);
    faulty.start({a.peer_address()}, typo);
    std::string logs;
    for (TestDaemon* d : {&a, &b, &c}) {
        eventually(d->name() + " reaches round " + std::to_string(kRounds), 180s, [&] {
            const std::string log = d->log();
            if (log.find("| loss nan") != std::string::npos ||
                log.find("| loss -nan") != std::string::npos)
                FAIL(d->name() << " trained to NaN\n" << daemon_log_tails());
            const auto rounds = method == "diloco" ? logged_diloco_rounds(log) : logged_rounds(log);
            return !rounds.empty() && rounds.back().round >= kRounds;
        });
        const auto rounds =
            method == "diloco" ? logged_diloco_rounds(d->log()) : logged_rounds(d->log());
        INFO(d->name() << "'s first and last training loss: " << rounds.front().loss << ", "
                       << rounds.back().loss);
        CHECK(std::isfinite(rounds.back().loss));
        CHECK(rounds.back().loss < rounds.front().loss - 0.5);
        const nlohmann::json status = d->status();
        REQUIRE(status.contains("val_loss"));
        INFO(d->name() << "'s validation loss: " << status["val_loss"]);
        CHECK(std::isfinite(status["val_loss"].get<double>()));
        CHECK(status["val_loss"].get<double>() < 4.0);  // ln 256 = 5.55 untrained
        logs += d->log();
    }
    for (TestDaemon* d : {&a, &b, &c, &faulty}) d->process().signal(SIGTERM);
    for (TestDaemon* d : {&a, &b, &c, &faulty}) d->process().wait(20s);
    return logs;
}

}  // namespace

TEST_CASE("a NoLoCo member whose learning rate is mistyped 1e2 is refused and sinks no one",
          "[integration]") {
    const std::string logs = run_with_faulty_member("noloco", "1e2");
    // Pairing is random, but in 40 rounds of 4 members an honest node meets the faulty one.
    CHECK((logs.find("exceeds 10.000000 times the larger of this node's own update") !=
               std::string::npos ||
           logs.find("is not finite") != std::string::npos));
}

TEST_CASE("a DiLoCo member whose learning rate is mistyped 1e3 cannot steer the mean",
          "[integration]") {
    run_with_faulty_member("diloco", "1e3");
}
