// starlingd processes on 127.0.0.1 for the integration tests, each with its own ports and data
// directory, configured the way an operator would: configs/pico.toml plus STARLING_* variables
// (short rounds, fast failure detection) and flags. The CLI is the real `starling` binary.
#pragma once

#include <catch2/catch.hpp>
#include <chrono>
#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "tests/integration/process.h"

namespace starling::test {

// Timeouts that hold on a busy machine (ctest beside two busy loops, a daemon's thread getting a
// third of a core): a pair timeout of a few round times, probes that a late answer does not fail.
inline constexpr int kPairTimeoutMs = 3000;
inline constexpr int kExchangeTimeoutMs = 3000;

std::string starlingd_binary();
// starlingd whose outgoing messages a fault alters (tests/integration/faulty_daemon/).
std::string faulty_starlingd_binary();
std::string starling_binary();
std::string pico_config();
// The variables every test daemon gets: the swarm secret, the KJV shards, pico on one thread
// with 8 inner steps a round, checkpoints every 2 rounds, 100 ms gossip.
Environment daemon_environment();

class TestDaemon {
public:
    TestDaemon(std::string name, const std::filesystem::path& root);
    // Starts (or restarts) starlingd with these seeds (host:port of other daemons' peer ports),
    // variables on top of daemon_environment(), and a config file (default: configs/pico.toml).
    void start(const std::vector<std::string>& seeds = {}, const Environment& extra = {},
               const std::string& config = pico_config());
    // What start() runs in place of starlingd, before starlingd's own arguments, e.g.
    // {faulty_starlingd_binary(), "--fault", "sign_flip"}.
    void run_as(std::vector<std::string> command) { command_ = std::move(command); }
    Process& process() { return *process_; }
    std::string peer_address() const { return "127.0.0.1:" + std::to_string(peer_port_); }
    std::string control_address() const { return "127.0.0.1:" + std::to_string(control_port_); }
    int metrics_port() const { return metrics_port_; }
    const std::filesystem::path& data_dir() const { return data_dir_; }
    const std::string& name() const { return name_; }
    std::string log() const;

    // `starling <args> --control <this daemon>`.
    CommandResult cli(const std::vector<std::string>& args) const;
    // `starling status --json`, parsed; throws when the command fails.
    nlohmann::json status() const;
    nlohmann::json peers() const;

private:
    std::string name_;
    std::filesystem::path data_dir_, log_path_;
    int peer_port_, control_port_, metrics_port_;
    std::vector<std::string> command_{starlingd_binary()};
    std::unique_ptr<Process> process_;
};

// A JSON value that protobuf may print as a string (64-bit integers) or as a number.
uint64_t json_u64(const nlohmann::json& value);
// A status field of `daemon`; 0 until the daemon answers and while the field is absent.
uint64_t status_u64(const TestDaemon& daemon, const char* key);

// The round lines of a daemon's log: round, training loss, seconds choosing a partner and
// exchanging.
struct LoggedRound {
    uint64_t round = 0;
    double loss = 0.0;
    double pair_seconds = 0.0;
    double exchange_seconds = 0.0;
    bool paired = false;
};
std::vector<LoggedRound> logged_rounds(const std::string& log);
// The validation losses the log gives ("round R: validation loss of the averaged weights X"), by
// round.
std::map<uint64_t, double> logged_val_losses(const std::string& log);
// DiLoCo's round lines: round and loss (quorum in place of the partner).
std::vector<LoggedRound> logged_diloco_rounds(const std::string& log);

// The last lines of every log of the daemons the latest TestDaemon's directory holds, so a
// failure shows what the daemons said.
std::string daemon_log_tails();

// Polls `done` every 100 ms; fails the test naming `what` after `limit`, with the daemons' logs.
template <typename Predicate>
void eventually(const std::string& what, std::chrono::milliseconds limit, Predicate done) {
    const auto deadline = std::chrono::steady_clock::now() + limit;
    while (!done()) {
        if (std::chrono::steady_clock::now() > deadline)
            FAIL(what << ": not within " << limit.count() << " ms\n" << daemon_log_tails());
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
}

// GET http://127.0.0.1:<port><path>, the body of the answer ("" when nothing answers).
std::string http_get(int port, const std::string& path);

}  // namespace starling::test
