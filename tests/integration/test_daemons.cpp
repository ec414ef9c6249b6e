// Real starlingd processes on 127.0.0.1 driven with the real `starling` CLI: a swarm forms and
// trains with paired rounds, survives a kill -9, takes the node back from its checkpoint, admits a
// newcomer through `starling join`, and drains on `starling leave` and on SIGTERM.
#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <fstream>
#include <regex>
#include <set>
#include <thread>

#include "tests/integration/daemon_harness.h"
#include "tests/support/files.h"
#include "tests/support/metrics_text.h"

using namespace starling::test;
using namespace std::chrono_literals;
using nlohmann::json;

namespace {

// The newest round a daemon's checkpoints hold, read from checkpoint.json.
uint64_t newest_checkpoint_round(const TestDaemon& daemon) {
    uint64_t newest = 0;
    for (const auto& entry :
         std::filesystem::directory_iterator(daemon.data_dir() / "checkpoints")) {
        const std::string name = entry.path().filename().string();
        if (name.rfind("step_", 0) != 0) continue;
        std::ifstream meta(entry.path() / "checkpoint.json");
        REQUIRE(std::filesystem::exists(entry.path() / "state.bin"));
        newest = std::max(newest, json::parse(meta)["round"].get<uint64_t>());
    }
    return newest;
}

// Every round a survivor finished after `from` waited no longer than the deadlines allow.
void check_rounds_bounded(const TestDaemon& daemon, uint64_t from) {
    const double bound = (kPairTimeoutMs + kExchangeTimeoutMs) / 1000.0 + 1.0;
    for (const LoggedRound& r : logged_rounds(daemon.log())) {
        if (r.round < from) continue;
        INFO(daemon.name() << " round " << r.round << ": pair " << r.pair_seconds << " s, exchange "
                           << r.exchange_seconds << " s");
        CHECK(r.pair_seconds + r.exchange_seconds <= bound);
    }
}

// The families docs/operator.md lists, with their types, from its metric table's rows
// (| `name{labels}` | type | ...): what dashboards and alert rules (deploy/) may rely on.
std::map<std::string, std::string> documented_metric_families() {
    std::ifstream doc(std::string(STARLING_SOURCE_DIR) + "/docs/operator.md");
    static const std::regex row(R"(^\| `([a-z_]+)[^`]*` \| (counter|gauge|histogram) \|)");
    std::map<std::string, std::string> families;
    std::smatch m;
    for (std::string line; std::getline(doc, line);)
        if (std::regex_search(line, m, row)) families[m[1]] = m[2];
    return families;
}

// The documented families that are absent until their first value (their row says "absent
// until"): a scrape may lack them, while every other documented family is there from the start.
std::set<std::string> documented_late_families() {
    std::ifstream doc(std::string(STARLING_SOURCE_DIR) + "/docs/operator.md");
    static const std::regex row(
        R"(^\| `([a-z_]+)[^`]*` \| (counter|gauge|histogram) \|.*absent until)");
    std::set<std::string> families;
    std::smatch m;
    for (std::string line; std::getline(doc, line);)
        if (std::regex_search(line, m, row)) families.insert(m[1]);
    return families;
}

// A process's resident memory as the kernel reports it in /proc/<pid>/status, in bytes.
double resident_bytes(pid_t pid) {
    std::ifstream status("/proc/" + std::to_string(pid) + "/status");
    for (std::string line; std::getline(status, line);)
        if (line.rfind("VmRSS:", 0) == 0) return std::stod(line.substr(6)) * 1024;
    return 0;
}

// A live daemon's scrape: every documented family with its type, and nothing else; the build
// and the phase as its status says them; the round-trip time of each peer; its memory as the
// kernel counts it; and promtool's lint of the names and units, where promtool is installed.
void check_scrape(TestDaemon& daemon, const std::vector<const TestDaemon*>& peers,
                  const std::filesystem::path& dir) {
    // Peers' round-trip times are sampled once a second, and a pico swarm reaches its rounds
    // faster than that: the scrape is taken once every peer has one.
    std::string metrics;
    const auto rtt_of = [&](const TestDaemon* peer) {
        return sample_value(metrics, "starling_peer_rtt_seconds{peer=\"" +
                                         peer->status()["node_id"].get<std::string>() + "\"}");
    };
    eventually(daemon.name() + "'s scrape holds every peer's round-trip time", 10s, [&] {
        metrics = http_get(daemon.metrics_port(), "/metrics");
        return std::all_of(peers.begin(), peers.end(),
                           [&](const TestDaemon* peer) { return rtt_of(peer).has_value(); });
    });
    INFO(daemon.name() << "'s scrape:\n" << metrics);
    const std::map<std::string, std::string> documented = documented_metric_families();
    REQUIRE(documented.size() >= 25);
    // Exactly the documented families, less those with no value yet (the validation loss, with
    // eval_every 0 here), each with its documented type.
    const std::set<std::string> late = documented_late_families();
    REQUIRE(late.count("starling_val_loss") == 1);
    const std::map<std::string, std::string> scraped = metric_families(metrics);
    std::map<std::string, std::string> expected;
    for (const auto& [name, type] : documented)
        if (late.count(name) == 0 || scraped.count(name) == 1) expected[name] = type;
    CHECK(scraped == expected);
    CHECK_FALSE(sample_value(metrics, "starling_val_loss").has_value());

    const json s = daemon.status();
    const std::string build =
        "starling_build_info{fingerprint=\"" + s["model_fingerprint"].get<std::string>() +
        "\",node=\"" + s["node_id"].get<std::string>() + "\",swarm=\"integration\",version=\"" +
        s["version"].get<std::string>() + "\"}";
    CHECK(sample_value(metrics, build) == 1.0);
    const std::regex phase_at_one(R"re(\nstarling_phase\{phase="([a-z]+)"\} 1\n)re");
    const auto phases_at_one = std::sregex_iterator(metrics.begin(), metrics.end(), phase_at_one);
    CHECK(std::distance(phases_at_one, std::sregex_iterator()) == 1);
    CHECK(sample_value(metrics, "starling_train_steps_target") == 100000.0);
    CHECK(sample_value(metrics, "starling_train_tokens_total") > 0.0);
    for (const TestDaemon* peer : peers) {
        const auto rtt = rtt_of(peer);
        REQUIRE(rtt.has_value());
        CHECK(*rtt > 0.0);
        CHECK(*rtt < 1.0);
    }
    const double rss = resident_bytes(daemon.process().pid());
    const auto reported = sample_value(metrics, "process_resident_memory_bytes");
    REQUIRE(reported.has_value());
    CHECK(*reported > 0.5 * rss);
    CHECK(*reported < 2.0 * rss);

    const std::filesystem::path scrape = dir / (daemon.name() + ".prom");
    std::ofstream(scrape) << metrics;
    const CommandResult lint =
        run_command({"/bin/sh", "-c",
                     "command -v promtool >/dev/null || exit 127; promtool check metrics < " +
                         scrape.string()});
    if (lint.status == 127) {
        WARN(
            "promtool is not installed (scripts/setup installs it): the scrape's names were not linted");
    } else {
        INFO(lint.output);
        CHECK(lint.status == 0);
    }
}

// Whether a daemon's scrape holds a round-trip time for `peer_id`.
bool has_rtt_of(const TestDaemon& daemon, const std::string& peer_id) {
    const std::string series = "starling_peer_rtt_seconds{peer=\"" + peer_id + "\"}";
    return sample_value(http_get(daemon.metrics_port(), "/metrics"), series).has_value();
}

}  // namespace

TEST_CASE("a swarm of starlingd processes trains, survives a crash, takes a newcomer and drains",
          "[integration]") {
    TempDir root;
    TestDaemon a("a", root.path()), b("b", root.path()), c("c", root.path());
    // b runs its rounds one after the other, so that it has an exchange phase to be stopped in
    // (the end of this test); a and c overlap theirs, as configs/pico.toml says.
    const Environment sequential{{"STARLING_SWARM_OVERLAP", "false"}};
    a.start();
    b.start({a.peer_address()}, sequential);
    c.start({a.peer_address()});
    std::vector<TestDaemon*> all{&a, &b, &c};

    // The swarm forms and trains in pairs.
    for (TestDaemon* d : all)
        eventually(d->name() + " sees 2 peers alive", 30s,
                   [&] { return status_u64(*d, "peers_alive") == 2; });
    for (TestDaemon* d : all)
        eventually(d->name() + " paired 3 rounds", 60s,
                   [&] { return status_u64(*d, "rounds_paired") >= 3; });
    eventually("a reaches round 8", 60s, [&] { return status_u64(a, "round") >= 8; });
    const std::vector<LoggedRound> early = logged_rounds(a.log());
    REQUIRE(early.size() >= 8);
    CHECK(early.back().loss < early.front().loss - 0.5);
    WARN("loss of node a: round " << early.front().round << " " << early.front().loss << ", round "
                                  << early.back().round << " " << early.back().loss);

    // `starling status` and `starling peers` show it, for people as for scripts.
    const CommandResult table = a.cli({"status"});
    CHECK(table.status == 0);
    INFO(table.output);
    CHECK(table.output.find(a.status()["node_id"].get<std::string>()) != std::string::npos);
    CHECK(std::regex_search(table.output, std::regex(R"(peers +\d+ alive, \d+ suspect)")));
    CHECK(std::regex_search(table.output, std::regex(R"(phase +(training|exchanging|waiting))")));
    // A busy machine can make a probe late and a peer briefly suspect: the listing settles.
    eventually("a lists b and c, alive and compatible", 10s, [&] {
        const json peers = a.peers();
        if (peers["peers"].size() != 2) return false;
        for (const json& p : peers["peers"])
            if (p["state"] != "alive" || p["compatible"] != true) return false;
        return true;
    });
    const std::string metrics = http_get(a.metrics_port(), "/metrics");
    std::smatch m;
    REQUIRE(std::regex_search(metrics, m,
                              std::regex(R"(starling_rounds_total\{outcome="paired"\} (\d+))")));
    CHECK(std::stoi(m[1]) >= 3);
    check_scrape(a, {&b, &c}, root.path());

    // kill -9: the others go on, never waiting past the deadlines, and forget its round-trip time.
    const std::string c_id = c.status()["node_id"];
    const uint64_t c_checkpoint = [&] {
        eventually("c has a checkpoint", 30s,
                   [&] { return std::filesystem::exists(c.data_dir() / "checkpoints"); });
        eventually("c has a checkpoint", 30s, [&] { return newest_checkpoint_round(c) > 0; });
        return newest_checkpoint_round(c);
    }();
    const uint64_t a_round_at_kill = status_u64(a, "round");
    c.process().signal(SIGKILL);
    REQUIRE(c.process().wait(5s) == 128 + SIGKILL);
    eventually("a's /metrics drops c's round-trip time once c is dead", 15s,
               [&] { return !has_rtt_of(a, c_id); });
    for (TestDaemon* d : {&a, &b})
        eventually(d->name() + " goes 4 rounds past the kill", 60s,
                   [&] { return status_u64(*d, "round") >= a_round_at_kill + 4; });
    check_rounds_bounded(a, a_round_at_kill);
    check_rounds_bounded(b, a_round_at_kill);

    // Restarted, it resumes from its checkpoint and pairs again.
    c.start({a.peer_address()});
    eventually("c resumes", 30s,
               [&] { return c.log().find("resumed from checkpoint") != std::string::npos; });
    std::smatch resumed;
    const std::string c_log = c.log();
    REQUIRE(std::regex_search(c_log, resumed,
                              std::regex(R"(resumed from checkpoint \S+ \(round (\d+))")));
    CHECK(std::stoull(resumed[1]) >= c_checkpoint);
    const uint64_t c_paired_before = status_u64(c, "rounds_paired");
    eventually("c pairs again", 60s,
               [&] { return status_u64(c, "rounds_paired") > c_paired_before; });

    // A newcomer started alone joins with `starling join` and copies the swarm's state.
    TestDaemon d("d", root.path());
    d.start();
    eventually("d trains alone", 30s, [&] { return status_u64(d, "round") >= 1; });
    const CommandResult joined = d.cli({"join", a.peer_address()});
    INFO(joined.output);
    REQUIRE(joined.status == 0);
    eventually("d copies the swarm's state", 60s,
               [&] { return d.log().find("joined at round") != std::string::npos; });
    eventually("d is level with the swarm", 30s,
               [&] { return status_u64(d, "round") + 2 >= status_u64(a, "round"); });
    eventually("d sees 3 peers", 30s, [&] { return status_u64(d, "peers_alive") == 3; });

    // `starling leave` drains it: exit 0, and the others see it leave.
    const std::string d_id = d.status()["node_id"];
    REQUIRE(d.cli({"leave"}).status == 0);
    REQUIRE(d.process().wait(20s) == 0);
    eventually("a sees d leave", 10s, [&] {
        const json listed = a.peers();
        for (const json& p : listed["peers"])
            if (p["node_id"] == d_id) return p["state"] == "left";
        return false;
    });

    // A fresh node started with a seed copies the swarm's state before its first round.
    TestDaemon e("e", root.path());
    e.start({a.peer_address()});
    eventually("e starts from the swarm's state", 30s, [&] {
        return e.log().find("a fresh node in a swarm at round") != std::string::npos;
    });
    eventually("e holds a snapshot", 30s,
               [&] { return e.log().find("joined at round") != std::string::npos; });
    std::smatch joined_at;
    const std::string e_log = e.log();
    REQUIRE(std::regex_search(e_log, joined_at, std::regex(R"(joined at round (\d+))")));
    CHECK(std::stoull(joined_at[1]) >= 1);
    e.process().signal(SIGTERM);
    REQUIRE(e.process().wait(20s) == 0);

    // SIGTERM in the middle of an exchange: exit 0 within T_xchg, and a checkpoint of the round.
    eventually("b is exchanging", 60s, [&] {
        try {
            return b.status()["phase"] == "NODE_PHASE_EXCHANGING";
        } catch (const std::exception&) {
            return false;
        }
    });
    const uint64_t b_round = status_u64(b, "round");
    b.process().signal(SIGTERM);
    REQUIRE(b.process().wait(std::chrono::milliseconds(kExchangeTimeoutMs) + 10s) == 0);
    CHECK(newest_checkpoint_round(b) >= b_round);
    b.start({a.peer_address()});
    eventually("b resumes", 30s,
               [&] { return b.log().find("resumed from checkpoint") != std::string::npos; });
    CHECK(status_u64(b, "round") >= b_round);

    for (TestDaemon* daemon : {&a, &b, &c}) daemon->process().signal(SIGTERM);
    for (TestDaemon* daemon : {&a, &b, &c}) CHECK(daemon->process().wait(20s) == 0);
}

TEST_CASE("starlingd refuses a corrupt config and an unwritable data directory, naming them",
          "[integration]") {
    TempDir root;
    const std::filesystem::path bad = root.path() / "bad.toml";
    std::ofstream(bad) << "[peer]\nlisn = \"127.0.0.1:7700\"\n";
    CommandResult r =
        run_command({starlingd_binary(), "--config", bad.string()}, daemon_environment());
    CHECK(r.status == 1);
    CHECK(r.output.find("[peer].lisn") != std::string::npos);

    std::ofstream(root.path() / "broken.toml") << "[model\nn_layer = 2\n";
    r = run_command({starlingd_binary(), "--config", (root.path() / "broken.toml").string()},
                    daemon_environment());
    CHECK(r.status == 1);
    CHECK(r.output.find("broken.toml:1") != std::string::npos);

    // Root may write anywhere, so the directory is made impossible: its parent is a file.
    std::ofstream(root.path() / "file") << "x";
    const std::string data_dir = (root.path() / "file" / "node").string();
    r = run_command({starlingd_binary(), "--config", pico_config(), "--data-dir", data_dir,
                     "--listen", "127.0.0.1:0", "--control", "127.0.0.1:0", "--metrics", ""},
                    daemon_environment());
    CHECK(r.status == 1);
    CHECK(r.output.find("[node].data_dir " + data_dir) != std::string::npos);
}

TEST_CASE(
    "a second starlingd on a port or a data directory in use exits 1 naming it, and unknown variables warn",
    "[integration]") {
    TempDir root;
    TestDaemon a("a", root.path());
    a.start();
    eventually("a answers", 30s, [&] { return a.cli({"status"}).status == 0; });
    Environment misspelt = daemon_environment();
    misspelt["STARLING_TRAIN_STPES"] = "5";
    const auto second = [&](const std::string& data_dir, const std::string& listen,
                            const std::string& control) {
        return run_command({starlingd_binary(), "--config", pico_config(), "--data-dir", data_dir,
                            "--listen", listen, "--control", control, "--metrics", ""},
                           misspelt);
    };
    const std::string own_dir = (root.path() / "second").string();

    CommandResult r = second(a.data_dir().string(), "127.0.0.1:0", "127.0.0.1:0");
    INFO(r.output);
    CHECK(r.status == 1);
    CHECK(r.output.find("environment variable STARLING_TRAIN_STPES is not a Starling setting") !=
          std::string::npos);
    // The settings' own variables (the secret, the data, the rounds) are not reported.
    CHECK(r.output.find("STARLING_PEER_SECRET is not") == std::string::npos);
    CHECK(r.output.find("STARLING_DATA_DIR is not") == std::string::npos);
    CHECK(r.output.find("is in use by another starlingd (PID " +
                        std::to_string(a.process().pid())) != std::string::npos);
    const CommandResult check = run_command({starling_binary(), "check", "--config", pico_config(),
                                             "--data-dir", a.data_dir().string()},
                                            daemon_environment());
    INFO(check.output);
    CHECK(check.status == 1);
    CHECK(check.output.find("in use by a running starlingd (PID " +
                            std::to_string(a.process().pid())) != std::string::npos);

    // gRPC's SO_REUSEPORT would let these bind, and then answer for a.
    r = second(own_dir, a.peer_address(), "127.0.0.1:0");
    INFO(r.output);
    CHECK(r.status == 1);
    CHECK(r.output.find("cannot listen on " + a.peer_address()) != std::string::npos);
    r = second(own_dir, "127.0.0.1:0", a.control_address());
    INFO(r.output);
    CHECK(r.status == 1);
    CHECK(r.output.find("[control].listen: cannot listen on " + a.control_address() +
                        ": Address already in use") != std::string::npos);
    // That line alone: not gRPC's own raw report of the bind before it.
    CHECK(r.output.find("chttp2_server") == std::string::npos);
    CHECK(r.output.find("Address already in use") == r.output.rfind("Address already in use"));

    // a is untouched, and once it has gone its directory takes a new daemon.
    CHECK(a.cli({"status"}).status == 0);
    a.process().signal(SIGKILL);
    a.process().wait(20s);
    a.start();
    eventually("a restarts on its own directory after a kill -9", 30s,
               [&] { return a.cli({"status"}).status == 0; });
    a.process().signal(SIGTERM);
    CHECK(a.process().wait(20s) == 0);
}

TEST_CASE(
    "a flood of connections that send only the HTTP/2 preface neither stops nor starves starlingd",
    "[integration]") {
    // The daemon starts with systemd's usual soft limit on descriptors, lowered further, and
    // must take the hard one; this process needs the room for its 400 sockets.
    rlimit mine{};
    REQUIRE(getrlimit(RLIMIT_NOFILE, &mine) == 0);
    if (mine.rlim_max < 1024) {
        WARN("skipped: the hard limit on open files (" << mine.rlim_max << ") is below 1024");
        return;
    }
    TempDir root;
    TestDaemon a("a", root.path());
    rlimit low = mine;
    low.rlim_cur = 256;
    REQUIRE(setrlimit(RLIMIT_NOFILE, &low) == 0);
    a.start();
    rlimit high = mine;
    high.rlim_cur = mine.rlim_max;
    REQUIRE(setrlimit(RLIMIT_NOFILE, &high) == 0);
    eventually("a answers", 30s, [&] { return a.cli({"status"}).status == 0; });
    const auto descriptors = [&] {
        return std::distance(std::filesystem::directory_iterator(
                                 "/proc/" + std::to_string(a.process().pid()) + "/fd"),
                             std::filesystem::directory_iterator{});
    };
    const auto before = descriptors();

    const std::string port = a.peer_address().substr(a.peer_address().rfind(':') + 1);
    std::vector<int> sockets;
    for (int i = 0; i < 400; i++) {
        const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        REQUIRE(fd >= 0);
        sockaddr_in address{};
        address.sin_family = AF_INET;
        address.sin_port = htons(static_cast<uint16_t>(std::stoi(port)));
        address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        REQUIRE(connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0);
        const char preface[] = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
        REQUIRE(write(fd, preface, sizeof(preface) - 1) ==
                static_cast<ssize_t>(sizeof(preface) - 1));
        sockets.push_back(fd);
    }
    CHECK(a.cli({"status"}).status == 0);
    // What the node sent (its HTTP/2 settings) is read and dropped up to the end of the stream.
    const auto closed_by_node = [&] {
        size_t closed = 0;
        for (const int fd : sockets) {
            char buffer[4096];
            ssize_t n = 0;
            while ((n = recv(fd, buffer, sizeof(buffer), MSG_DONTWAIT)) > 0) {
            }
            if (n == 0 || (errno != EAGAIN && errno != EINTR)) closed++;
        }
        return closed;
    };
    // One address may hold 16 unauthenticated connections: the rest are closed as they come, well
    // before gRPC's 10 s handshake timeout would, and those 16 once their 10 s are up.
    eventually("all but 16 connections are closed at once", 5s,
               [&] { return closed_by_node() >= 400 - 16; });
    eventually("the 16 are closed when their time is up", 30s,
               [&] { return closed_by_node() == 400; });
    eventually("the half-open connections' descriptors are gone", 10s,
               [&] { return descriptors() < before + 20; });
    const auto closed_count = [&] {
        return sample_value(http_get(a.metrics_port(), "/metrics"),
                            R"(starling_failures_total{reason="connection"})")
            .value_or(0.0);
    };
    eventually("/metrics counts every one", 10s, [&] { return closed_count() == 400.0; });
    CHECK(a.cli({"status"}).status == 0);
    for (const int fd : sockets) close(fd);
    CHECK(a.log().find("Too many open files") == std::string::npos);
    a.process().signal(SIGTERM);
    CHECK(a.process().wait(20s) == 0);
}

TEST_CASE(
    "a node with the wrong swarm secret is refused loudly on both sides, and starling check says so",
    "[integration]") {
    TempDir root;
    TestDaemon a("a", root.path()), b("b", root.path());
    a.start();
    eventually("a answers", 30s, [&] { return a.cli({"status"}).status == 0; });
    const Environment wrong{{"STARLING_PEER_SECRET", "not the swarm's secret at all"}};
    b.start({a.peer_address()}, wrong);
    eventually("both logs say it at warn", 30s, [&] {
        return a.log().find("wrong swarm secret") != std::string::npos &&
               b.log().find("seed " + a.peer_address() + " refused this node") != std::string::npos;
    });
    // a refused b's calls, and b had its joins refused: both are auth failures.
    const auto auth_failures = [](const TestDaemon& d) {
        return sample_value(http_get(d.metrics_port(), "/metrics"),
                            R"(starling_failures_total{reason="auth"})")
            .value_or(0.0);
    };
    eventually("both count it in /metrics", 10s,
               [&] { return auth_failures(a) >= 1 && auth_failures(b) >= 1; });

    Environment check_env = daemon_environment();
    check_env["STARLING_PEER_SECRET"] = wrong.at("STARLING_PEER_SECRET");
    const std::vector<std::string> check = {starling_binary(), "check",
                                            "--config",        pico_config(),
                                            "--data-dir",      (root.path() / "checked").string(),
                                            "--seed",          a.peer_address()};
    CommandResult r = run_command(check, check_env);
    INFO(r.output);
    CHECK(r.status == 1);
    CHECK(r.output.find("refused this node's credentials: " + a.peer_address()) !=
          std::string::npos);
    r = run_command(check, daemon_environment());
    INFO(r.output);
    CHECK(r.output.find("refused this node's credentials") == std::string::npos);
    CHECK(r.output.find(a.peer_address()) != std::string::npos);

    for (TestDaemon* d : {&a, &b}) d->process().signal(SIGTERM);
    for (TestDaemon* d : {&a, &b}) CHECK(d->process().wait(20s) == 0);
}

TEST_CASE(
    "a node with another model is named on both sides with the key that differs, and by starling check",
    "[integration]") {
    TempDir root;
    TestDaemon a("a", root.path()), b("b", root.path());
    a.start();
    eventually("a answers", 30s, [&] { return a.cli({"status"}).status == 0; });
    b.start({a.peer_address()}, {{"STARLING_MODEL_N_LAYER", "3"}});
    eventually("both logs name the key", 30s, [&] {
        return a.log().find("runs another model (n_layer 3 there, 2 here)") != std::string::npos &&
               b.log().find("runs another model (n_layer 2 there, 3 here)") != std::string::npos;
    });
    Environment three = daemon_environment();
    three["STARLING_MODEL_N_LAYER"] = "3";
    const CommandResult r =
        run_command({starling_binary(), "check", "--config", pico_config(), "--data-dir",
                     (root.path() / "checked").string(), "--seed", a.peer_address()},
                    three);
    INFO(r.output);
    CHECK(r.status == 1);
    CHECK(r.output.find("can never pair with this node: " + a.peer_address() +
                        " runs another model (n_layer 2 there, 3 here)") != std::string::npos);
    for (TestDaemon* d : {&a, &b}) d->process().signal(SIGTERM);
    for (TestDaemon* d : {&a, &b}) CHECK(d->process().wait(20s) == 0);
}

TEST_CASE(
    "starling join dials each seed before it answers: one that cannot be reached fails naming it "
    "and why, a live one joins",
    "[integration]") {
    TempDir root;
    TestDaemon a("a", root.path()), b("b", root.path());
    a.start();
    b.start();
    for (TestDaemon* d : {&a, &b})
        eventually(d->name() + " answers", 30s, [&] { return d->cli({"status"}).status == 0; });

    const std::string nowhere = "127.0.0.1:" + std::to_string(free_port());
    CommandResult r = b.cli({"join", nowhere});
    INFO(r.output);
    CHECK(r.status == 1);
    CHECK(r.output.find("cannot join through seed " + nowhere + ": ") != std::string::npos);
    eventually("b logs the seed it cannot reach at warn", 10s, [&] {
        const std::string log = b.log();
        return log.find("warning peer: cannot join through seed " + nowhere) != std::string::npos;
    });
    r = b.cli({"join", b.peer_address()});
    INFO(r.output);
    CHECK(r.status == 1);
    CHECK(r.output.find("this node's own address") != std::string::npos);

    // Both at once: the live one is joined, the other named, and the exit status says not all.
    r = b.cli({"join", a.peer_address(), nowhere});
    INFO(r.output);
    CHECK(r.status == 1);
    CHECK(r.output.find("joined the swarm through " + a.peer_address()) != std::string::npos);
    CHECK(r.output.find("cannot join through seed " + nowhere) != std::string::npos);
    r = b.cli({"join", a.peer_address()});
    INFO(r.output);
    CHECK(r.status == 0);
    eventually("a sees b", 30s, [&] {
        const json peers = a.peers()["peers"];
        return peers.size() == 1 && peers[0]["state"] == "alive";
    });

    for (TestDaemon* d : {&a, &b}) d->process().signal(SIGTERM);
    for (TestDaemon* d : {&a, &b}) CHECK(d->process().wait(20s) == 0);
}

TEST_CASE("the Control API answers on 127.0.0.1 only, by default", "[integration]") {
    // A non-loopback address of this machine, if it has one.
    std::string outside;
    ifaddrs* list = nullptr;
    if (getifaddrs(&list) == 0) {
        for (ifaddrs* i = list; i && outside.empty(); i = i->ifa_next) {
            if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET) continue;
            char text[INET_ADDRSTRLEN];
            inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr, text,
                      sizeof(text));
            if (std::string(text).rfind("127.", 0) != 0) outside = text;
        }
        freeifaddrs(list);
    }
    if (outside.empty()) {
        WARN("skipped: this machine has no non-loopback IPv4 address to try the Control port from");
        return;
    }
    TempDir root;
    TestDaemon a("a", root.path());
    a.start();
    eventually("a answers on 127.0.0.1", 30s, [&] { return a.cli({"status"}).status == 0; });
    const std::string port = a.control_address().substr(a.control_address().rfind(':') + 1);
    const CommandResult r =
        run_command({starling_binary(), "--control", outside + ":" + port, "status"});
    INFO(r.output);
    CHECK(r.status == 2);
    a.process().signal(SIGTERM);
    CHECK(a.process().wait(20s) == 0);
}

TEST_CASE(
    "two starlingd with overlapped rounds pair, land each outer step in the next inner phase, and "
    "drain to a checkpoint of the round after the last one landed",
    "[integration]") {
    TempDir root;
    TestDaemon a("a", root.path()), b("b", root.path());
    a.start();  // configs/pico.toml overlaps rounds
    b.start({a.peer_address()});
    for (TestDaemon* d : {&a, &b})
        eventually(d->name() + " lands 6 paired rounds", 60s, [&] {
            const auto rounds = logged_rounds(d->log());
            return std::count_if(rounds.begin(), rounds.end(),
                                 [](const LoggedRound& r) { return r.paired; }) >= 6;
        });
    const json status = a.status();
    CHECK(status["train_seconds"].get<double>() > 0.0);
    CHECK(status["train_seconds"].get<double>() < status["uptime_seconds"].get<double>());

    a.process().signal(SIGTERM);
    REQUIRE(a.process().wait(std::chrono::milliseconds(kExchangeTimeoutMs) + 10s) == 0);
    const std::string log = a.log();
    CHECK(log.find("| landed ") != std::string::npos);
    const std::vector<LoggedRound> rounds = logged_rounds(log);
    REQUIRE(rounds.size() >= 6);
    for (size_t i = 1; i < rounds.size(); i++) CHECK(rounds[i].round == rounds[i - 1].round + 1);
    CHECK(rounds.back().loss < rounds.front().loss - 0.5);
    // The drain landed the exchange in flight and saved the start of the round after it.
    CHECK(newest_checkpoint_round(a) == rounds.back().round + 1);

    a.start({b.peer_address()});
    eventually("a resumes", 30s,
               [&] { return a.log().find("resumed from checkpoint") != std::string::npos; });
    std::smatch resumed;
    const std::string restarted = a.log();
    REQUIRE(std::regex_search(restarted, resumed,
                              std::regex(R"(resumed from checkpoint \S+ \(round (\d+))")));
    CHECK(std::stoull(resumed[1]) == rounds.back().round + 1);
    for (TestDaemon* d : {&a, &b}) d->process().signal(SIGTERM);
    for (TestDaemon* d : {&a, &b}) CHECK(d->process().wait(20s) == 0);
}

#if STARLING_CUDA_EMULATION
// The CUDA backend's kernels inside real daemons: three nodes on emulated devices pair and learn.
TEST_CASE("three starlingd train together on emulated CUDA devices", "[integration][gpu]") {
    TempDir root;
    TestDaemon a("a", root.path()), b("b", root.path()), c("c", root.path());
    const Environment on_gpu{{"STARLING_TRAIN_DEVICE", "cuda:0"}};
    a.start({}, on_gpu);
    b.start({a.peer_address()}, on_gpu);
    c.start({a.peer_address()}, on_gpu);
    for (TestDaemon* d : {&a, &b, &c}) {
        eventually(d->name() + " paired 2 rounds", 120s,
                   [&] { return status_u64(*d, "rounds_paired") >= 2; });
        INFO(d->log());
        CHECK(d->log().find("emulated device 0") != std::string::npos);
    }
    eventually("a reaches round 6", 120s, [&] { return status_u64(a, "round") >= 6; });
    const std::vector<LoggedRound> rounds = logged_rounds(a.log());
    REQUIRE(rounds.size() >= 6);
    CHECK(rounds.back().loss < rounds.front().loss - 0.3);
}
#endif
