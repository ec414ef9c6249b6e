// starlingd as a service manager sees it: the systemd notify protocol (READY, STATUS, WATCHDOG,
// STOPPING) on a socket of the test's own, SIGHUP reloading the config, `starling watch`, the gRPC
// health service, and DiLoCo mode.
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <poll.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <future>
#include <optional>
#include <fstream>
#include <regex>
#include <sstream>
#include <thread>

#include "daemon/config.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "tests/integration/daemon_harness.h"
#include "tests/peer/tls_util.h"
#include "tests/support/files.h"
#include "tests/support/metrics_text.h"

using namespace starling::test;
using starling::read_file;
using starling::write_file_atomic;
using namespace std::chrono_literals;

namespace {

// A datagram socket standing in for systemd's notify socket.
class NotifySocket {
public:
    explicit NotifySocket(const std::filesystem::path& path) : path_(path) {
        fd_ = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
        sockaddr_un address{};
        address.sun_family = AF_UNIX;
        std::snprintf(address.sun_path, sizeof(address.sun_path), "%s", path.c_str());
        REQUIRE(bind(fd_, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0);
    }
    ~NotifySocket() { close(fd_); }

    // Every message that arrives within `limit`, until one satisfies `stop`.
    template <typename Stop>
    std::vector<std::string> collect(std::chrono::milliseconds limit, Stop stop) {
        std::vector<std::string> messages;
        const auto deadline = std::chrono::steady_clock::now() + limit;
        while (std::chrono::steady_clock::now() < deadline) {
            pollfd p{fd_, POLLIN, 0};
            if (poll(&p, 1, 50) != 1) continue;
            char buffer[4096];
            const ssize_t n = recv(fd_, buffer, sizeof(buffer), 0);
            if (n <= 0) continue;
            messages.emplace_back(buffer, static_cast<size_t>(n));
            if (stop(messages.back())) break;
        }
        return messages;
    }

private:
    std::filesystem::path path_;
    int fd_;
};

size_t count_containing(const std::vector<std::string>& messages, const std::string& text) {
    return static_cast<size_t>(
        std::count_if(messages.begin(), messages.end(),
                      [&](const std::string& m) { return m.find(text) != std::string::npos; }));
}

// The spin count libgomp settled on, from the last OMP_DISPLAY_ENV=verbose listing in `output`:
// 0 under the passive policy, 300000 with none set, 30000000000 under the active one.
std::string openmp_spin_count(const std::string& output) {
    const std::string key = "GOMP_SPINCOUNT = '";
    const size_t at = output.rfind(key);
    if (at == std::string::npos) return "(not listed)";
    const size_t start = at + key.size();
    return output.substr(start, output.find('\'', start) - start);
}

}  // namespace

TEST_CASE("starlingd speaks systemd's notify protocol: READY, STATUS, WATCHDOG and STOPPING",
          "[integration]") {
    TempDir root;
    NotifySocket systemd(root.path() / "notify");
    TestDaemon a("a", root.path());
    // WATCHDOG_USEC without WATCHDOG_PID: the watchdog applies to whichever process reads it.
    a.start({},
            {{"NOTIFY_SOCKET", (root.path() / "notify").string()}, {"WATCHDOG_USEC", "2000000"}});

    const auto started = systemd.collect(
        30s, [](const std::string& m) { return m.find("READY=1") != std::string::npos; });
    REQUIRE(count_containing(started, "READY=1") == 1);
    // Pings at half the watchdog interval (1 s) while rounds progress, and a status line: waited
    // for, not counted within a fixed time, since a busy machine slows the rounds.
    size_t pings = 0, statuses = 0;
    systemd.collect(120s, [&](const std::string& m) {
        pings += m.find("WATCHDOG=1") != std::string::npos;
        statuses += m.find("STATUS=round ") != std::string::npos;
        return pings >= 4 && statuses >= 1;
    });
    CHECK(pings >= 4);
    CHECK(statuses >= 1);

    a.process().signal(SIGTERM);
    const auto stopping = systemd.collect(
        20s, [](const std::string& m) { return m.find("STOPPING=1") != std::string::npos; });
    CHECK(count_containing(stopping, "STOPPING=1") == 1);
    CHECK(a.process().wait(20s) == 0);
}

TEST_CASE("starlingd's OpenMP threads wait passively unless OMP_WAIT_POLICY chooses",
          "[integration]") {
    const auto spin_count_with = [](const std::vector<std::string>& policy) {
        std::vector<std::string> argv{"/usr/bin/env", "-u", "OMP_WAIT_POLICY",
                                      "OMP_DISPLAY_ENV=verbose"};
        argv.insert(argv.end(), policy.begin(), policy.end());
        argv.insert(argv.end(), {starlingd_binary(), "--version"});
        const CommandResult run = run_command(argv);
        CHECK(run.status == 0);
        CHECK(run.output.find("starlingd ") != std::string::npos);
        return openmp_spin_count(run.output);
    };
    CHECK(spin_count_with({}) == "0");
    CHECK(spin_count_with({"OMP_WAIT_POLICY=active"}) == "30000000000");
    CHECK(spin_count_with({"OMP_WAIT_POLICY=passive"}) == "0");
}

TEST_CASE("SIGHUP re-reads the config, and a broken one is refused and the running settings kept",
          "[integration]") {
    TempDir root;
    const std::filesystem::path config = root.path() / "node.toml";
    std::filesystem::copy_file(pico_config(), config);
    TestDaemon a("a", root.path());
    a.start({}, {}, config.string());
    eventually("a answers", 30s, [&] { return a.cli({"status"}).status == 0; });

    // The environment pins checkpoint_every for every test daemon, so the file changes what it can:
    // the seeds and the log level.
    std::stringstream text;
    text << std::ifstream(config).rdbuf();
    std::string edited =
        std::regex_replace(text.str(), std::regex(R"(seeds = \[\])"), R"(seeds = ["127.0.0.1:1"])");
    REQUIRE(edited != text.str());
    std::ofstream(config) << edited;
    a.process().signal(SIGHUP);
    eventually("the reload is logged", 10s,
               [&] { return a.log().find("1 new seed(s)") != std::string::npos; });

    std::ofstream(config) << "[peer\n";
    a.process().signal(SIGHUP);
    eventually("the broken file is refused", 10s, [&] {
        return a.log().find("(the running settings are kept)") != std::string::npos;
    });
    CHECK(a.log().find("node.toml:1") != std::string::npos);
    CHECK(a.cli({"status"}).status == 0);
    a.process().signal(SIGTERM);
    CHECK(a.process().wait(20s) == 0);
}

TEST_CASE("SIGHUP puts rotated TLS certificates in use once they check out", "[integration]") {
    TempDir root;
    const std::filesystem::path pki = root.path() / "pki";
    std::filesystem::create_directories(pki);
    make_ca(pki, "old-ca");
    make_ca(pki, "new-ca");
    write_file_atomic(pki / "both.pem",
                      read_file(pki / "old-ca.pem") + read_file(pki / "new-ca.pem"));
    // a's files live where its config points, and are replaced in place, as certbot or
    // cert-manager do.
    const std::filesystem::path live = root.path() / "a-tls";
    std::filesystem::create_directories(live);
    const auto install = [&](const starling::TlsConfig& tls, const std::filesystem::path& ca) {
        write_file_atomic(live / "ca.pem", read_file(ca));
        write_file_atomic(live / "cert.pem", read_file(tls.cert));
        write_file_atomic(live / "key.pem", read_file(tls.key));
    };
    const auto tls_environment = [](const starling::TlsConfig& tls) {
        return Environment{{"STARLING_PEER_TLS_CA", tls.ca.string()},
                           {"STARLING_PEER_TLS_CERT", tls.cert.string()},
                           {"STARLING_PEER_TLS_KEY", tls.key.string()}};
    };
    install(make_node_tls(pki, "old-ca", "a-old"), pki / "old-ca.pem");
    TestDaemon a("a", root.path());
    a.start({}, tls_environment({live / "ca.pem", live / "cert.pem", live / "key.pem"}));
    eventually("a answers", 30s, [&] { return a.cli({"status"}).status == 0; });
    // b already has a new-CA certificate, which a does not trust yet.
    starling::TlsConfig b_tls = make_node_tls(pki, "new-ca", "b");
    b_tls.ca = pki / "both.pem";
    TestDaemon b("b", root.path());
    b.start({a.peer_address()}, tls_environment(b_tls));
    eventually("b answers", 30s, [&] { return b.cli({"status"}).status == 0; });
    std::this_thread::sleep_for(2s);
    CHECK(a.peers()["peers"].empty());

    // A key that is not the new certificate's: refused, the old files stay in use.
    const starling::TlsConfig a_new = make_node_tls(pki, "new-ca", "a-new");
    install({pki / "both.pem", a_new.cert, b_tls.key}, pki / "both.pem");
    a.process().signal(SIGHUP);
    eventually("the mismatched key is refused", 10s, [&] {
        return a.log().find("is not the key of the certificate") != std::string::npos;
    });
    CHECK(a.log().find("(the running settings are kept)") != std::string::npos);

    install(a_new, pki / "both.pem");
    a.process().signal(SIGHUP);
    eventually("the new certificate is in use", 10s,
               [&] { return a.log().find("in use for new connections") != std::string::npos; });
    eventually("b joins a", 60s, [&] {
        const nlohmann::json peers = a.peers()["peers"];
        return peers.size() == 1 && peers[0]["state"] == "alive";
    });
    a.process().signal(SIGTERM);
    b.process().signal(SIGTERM);
    CHECK(a.process().wait(20s) == 0);
    CHECK(b.process().wait(20s) == 0);
}

TEST_CASE("starling watch follows a running node and stops after --count updates",
          "[integration]") {
    TempDir root;
    TestDaemon a("a", root.path());
    a.start();
    eventually("a answers", 30s, [&] { return a.cli({"status"}).status == 0; });
    const CommandResult watched = a.cli({"watch", "--interval-ms", "100", "--count", "3"});
    INFO(watched.output);
    CHECK(watched.status == 0);
    // Not a terminal: one line per update, each naming the round.
    CHECK(std::count(watched.output.begin(), watched.output.end(), '\n') == 3);
    CHECK(watched.output.find("round") != std::string::npos);
    a.process().signal(SIGTERM);
    CHECK(a.process().wait(20s) == 0);
}

TEST_CASE(
    "starlingd writes one JSON object per log line with the time zone when asked, and names its release",
    "[integration]") {
    TempDir root;
    TestDaemon a("a", root.path());
    a.start({}, {{"STARLING_NODE_LOG_FORMAT", "json"}});
    eventually("a answers", 30s, [&] { return a.cli({"status"}).status == 0; });
    eventually("a finishes a round", 30s, [&] { return json_u64(a.status()["round"]) >= 1; });
    a.process().signal(SIGTERM);
    CHECK(a.process().wait(20s) == 0);
    std::istringstream lines(a.log());
    std::string line;
    int objects = 0;
    bool round_line = false;
    while (std::getline(lines, line)) {
        if (line.empty() || line[0] != '{') continue;  // the harness's own header
        INFO(line);
        const nlohmann::json entry = nlohmann::json::parse(line);
        CHECK(
            std::regex_match(entry.at("time").get<std::string>(),
                             std::regex(R"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}[+-]\d\d:\d\d)")));
        CHECK(entry.at("level").is_string());
        round_line = round_line ||
                     entry.at("message").get<std::string>().find("| loss ") != std::string::npos;
        objects++;
    }
    CHECK(objects >= 3);
    CHECK(round_line);

    const CommandResult version = run_command({starlingd_binary(), "--version"});
    CHECK(version.status == 0);
    CHECK(version.output.rfind("starlingd ", 0) == 0);
    const CommandResult bad =
        run_command({starlingd_binary(), "--config", pico_config(), "--log-format", "xml"},
                    daemon_environment());
    CHECK(bad.status == 1);
    CHECK(bad.output.find("log_format \"xml\" is not text or json") != std::string::npos);
}

TEST_CASE(
    "starling export and sample take a running node's model, the same as its final checkpoint's",
    "[integration]") {
    TempDir root;
    TestDaemon a("a", root.path());
    a.start({}, {{"STARLING_TRAIN_STEPS",
                  "80"}});  // 10 rounds, then the node is done and keeps its state
    eventually("a answers", 30s, [&] { return a.cli({"status"}).status == 0; });
    eventually("a is done", 60s, [&] { return a.status()["phase"] == "NODE_PHASE_DONE"; });

    const CommandResult live = a.cli({"export", "--hf", (root.path() / "live").string()});
    INFO(live.output);
    REQUIRE(live.status == 0);
    CHECK(live.output.find("exported round 10 of the node at " + a.control_address()) !=
          std::string::npos);
    Environment env = daemon_environment();
    const CommandResult saved =
        run_command({starling_binary(), "export", "--config", pico_config(), "--data-dir",
                     a.data_dir().string(), "--hf", (root.path() / "saved").string()},
                    env);
    INFO(saved.output);
    REQUIRE(saved.status == 0);
    CHECK(saved.output.find("exported round 10 of " + (a.data_dir() / "checkpoints").string()) !=
          std::string::npos);
    CHECK(slurp(root.path() / "live" / "model.safetensors") ==
          slurp(root.path() / "saved" / "model.safetensors"));
    CHECK(slurp(root.path() / "live" / "config.json") ==
          slurp(root.path() / "saved" / "config.json"));

    // Greedy text from the node and from the export agree.
    const std::vector<std::string> greedy = {"--prompt", "In the beginning", "--tokens",
                                             "24",       "--temperature",    "0"};
    std::vector<std::string> from_node = {"sample"},
                             from_export = {starling_binary(), "sample", "--model",
                                            (root.path() / "live").string()};
    from_node.insert(from_node.end(), greedy.begin(), greedy.end());
    from_export.insert(from_export.end(), greedy.begin(), greedy.end());
    const CommandResult node_text = a.cli(from_node);
    const CommandResult export_text = run_command(from_export);
    CHECK(node_text.status == 0);
    CHECK(node_text.output.rfind("In the beginning", 0) == 0);
    CHECK(node_text.output.size() == std::string("In the beginning").size() + 24 + 1);
    CHECK(node_text.output == export_text.output);
    a.process().signal(SIGTERM);
    CHECK(a.process().wait(20s) == 0);
}

namespace {

// Starts the daemons in DiLoCo mode, the first as the others' seed, and waits until each has
// gathered from all of them and logged round 8.
void start_diloco_swarm(const std::vector<TestDaemon*>& daemons, const Environment& environment) {
    for (TestDaemon* d : daemons) {
        d->start(d == daemons[0] ? std::vector<std::string>{}
                                 : std::vector<std::string>{daemons[0]->peer_address()},
                 environment);
    }
    const std::string everyone = "| quorum " + std::to_string(daemons.size()) + " |";
    for (TestDaemon* d : daemons) {
        eventually(d->name() + " gathers from all", 60s,
                   [&] { return d->log().find(everyone) != std::string::npos; });
        eventually(d->name() + " reaches round 8", 60s, [&] {
            const auto rounds = logged_diloco_rounds(d->log());
            return !rounds.empty() && rounds.back().round >= 8;
        });
    }
}

}  // namespace

TEST_CASE("three starlingd in DiLoCo mode gather every member's message each round and learn",
          "[integration]") {
    TempDir root;
    TestDaemon a("a", root.path()), b("b", root.path()), c("c", root.path());
    start_diloco_swarm({&a, &b, &c}, {{"STARLING_SWARM_METHOD", "diloco"}});
    const auto rounds = logged_diloco_rounds(a.log());
    CHECK(rounds.back().loss < rounds.front().loss - 0.5);
    const nlohmann::json status = a.status();
    CHECK(status["method"] == "diloco");
    CHECK(status["last_quorum"] == 3);
    for (TestDaemon* d : {&a, &b, &c}) d->process().signal(SIGTERM);
    for (TestDaemon* d : {&a, &b, &c}) CHECK(d->process().wait(20s) == 0);
}

TEST_CASE("two and three starlingd in DiLoCo mode train with TOPK deltas over the wire",
          "[integration]") {
    const size_t count = GENERATE(size_t{2}, size_t{3});
    TempDir root;
    std::vector<std::unique_ptr<TestDaemon>> owned;
    std::vector<TestDaemon*> daemons;
    for (size_t i = 0; i < count; i++) {
        owned.push_back(std::make_unique<TestDaemon>(std::string(1, char('a' + i)), root.path()));
        daemons.push_back(owned.back().get());
    }
    start_diloco_swarm(daemons, {{"STARLING_SWARM_METHOD", "diloco"},
                                 {"STARLING_EXCHANGE_DELTA_CODEC", "TOPK"},
                                 {"STARLING_EXCHANGE_TOPK_DENSITY", "0.05"}});
    TestDaemon& a = *daemons[0];
    const auto rounds = logged_diloco_rounds(a.log());
    CHECK(rounds.back().loss < rounds.front().loss - 0.3);
    // What a round sends: the TOPK message of 5% of each 4096 values in 2 bits (codec/README.md)
    // with its framing and signature, to each other member, under a tenth of a byte per
    // parameter each.
    const double parameters = starling::load_train_config(pico_config()).model.num_parameters();
    const std::regex sent("\\| quorum " + std::to_string(count) + R"( \| sent (\d+) B)");
    std::smatch m;
    const std::string log = a.log();
    REQUIRE(std::regex_search(log, m, sent));
    const double per_parameter = std::stod(m[1]) / parameters / double(count - 1);
    CHECK(per_parameter > 0.04);  // 205 kept of 4096: 4 low bits, the bitmap, 2-bit values: 0.054
    CHECK(per_parameter < 0.1);
    for (TestDaemon* d : daemons) d->process().signal(SIGTERM);
    for (TestDaemon* d : daemons) CHECK(d->process().wait(20s) == 0);
}

TEST_CASE("two starlingd in NoLoCo split mode train with TOPK deltas and phi every other round",
          "[integration]") {
    TempDir root;
    TestDaemon a("a", root.path()), b("b", root.path());
    const Environment split{{"STARLING_EXCHANGE_MODE", "split"},
                            {"STARLING_EXCHANGE_STATE_CODEC", "Q8"},
                            {"STARLING_EXCHANGE_DELTA_CODEC", "TOPK"},
                            {"STARLING_EXCHANGE_TOPK_DENSITY", "0.05"},
                            {"STARLING_EXCHANGE_PHI_EVERY", "2"}};
    a.start({}, split);
    b.start({a.peer_address()}, split);
    for (TestDaemon* d : {&a, &b})
        eventually(d->name() + " paired 8 rounds", 120s,
                   [&] { return status_u64(*d, "rounds_paired") >= 8; });
    const std::vector<LoggedRound> rounds = logged_rounds(a.log());
    REQUIRE(rounds.size() >= 8);
    CHECK(rounds.back().loss < rounds.front().loss - 0.3);
    // A split message is phi in Q8 (1.0625 bytes a parameter) beside D in TOPK (0.054) in the
    // even rounds, D alone in the odd ones: Q8's D would add another 1.0625.
    const double parameters = starling::load_train_config(pico_config()).model.num_parameters();
    const std::regex sent(R"(round (\d+) .*\| partner [0-9a-f]+ \| sent (\d+) B)");
    std::istringstream log(a.log());
    size_t with_phi = 0, without = 0;
    for (std::string line; std::getline(log, line);) {
        std::smatch m;
        // Paired rounds only: a failed exchange may have sent part of its message.
        if (!std::regex_search(line, m, sent) || line.find("solo:") != std::string::npos) continue;
        const bool even = std::stoull(m[1]) % 2 == 0;
        const double per_parameter = std::stod(m[2]) / parameters;
        CHECK(per_parameter > (even ? 1.0625 : 0.0) + 0.04);
        CHECK(per_parameter < (even ? 1.0625 : 0.0) + 0.1);
        (even ? with_phi : without)++;
    }
    CHECK(with_phi >= 2);
    CHECK(without >= 2);
    for (TestDaemon* d : {&a, &b}) d->process().signal(SIGTERM);
    for (TestDaemon* d : {&a, &b}) CHECK(d->process().wait(20s) == 0);
}

namespace {

// The peer port speaks TLS made from the swarm secret; the control port plain gRPC.
std::shared_ptr<grpc::ChannelCredentials> peer_port_credentials() {
    return starling::channel_credentials({}, daemon_environment().at("STARLING_PEER_SECRET"));
}

// grpc.health.v1.Health/Check on `address`, as a Kubernetes gRPC probe sends it (plain gRPC
// unless told).
std::optional<grpc::health::v1::HealthCheckResponse::ServingStatus> health_of(
    const std::string& address,
    std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::InsecureChannelCredentials()) {
    auto stub = grpc::health::v1::Health::NewStub(grpc::CreateChannel(address, credentials));
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + 5s);
    grpc::health::v1::HealthCheckResponse response;
    if (!stub->Check(&context, {}, &response).ok()) return std::nullopt;
    return response.status();
}

// The status of one ServerReflectionInfo call carrying an empty request: OK where reflection is
// served, UNIMPLEMENTED where it is not.
grpc::StatusCode reflection_status(
    const std::string& address,
    std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::InsecureChannelCredentials()) {
    grpc::GenericStub stub(grpc::CreateChannel(address, credentials));
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + 5s);
    grpc::Slice empty;
    const grpc::ByteBuffer request(&empty, 1);
    grpc::ByteBuffer response;
    std::promise<grpc::Status> done;
    stub.UnaryCall(&context, "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
                   grpc::StubOptions(), &request, &response,
                   [&](const grpc::Status& status) { done.set_value(status); });
    return done.get_future().get().error_code();
}

}  // namespace

TEST_CASE(
    "the gRPC health service answers SERVING on the control port and to holders of the secret on "
    "the peer port, reflection on control only",
    "[integration]") {
    TempDir root;
    TestDaemon a("a", root.path());
    a.start();
    eventually("a answers", 30s, [&] { return a.cli({"status"}).status == 0; });
    CHECK(health_of(a.control_address()) == grpc::health::v1::HealthCheckResponse::SERVING);
    CHECK(health_of(a.peer_address(), peer_port_credentials()) ==
          grpc::health::v1::HealthCheckResponse::SERVING);
    // Without the secret the peer port ends the connection in the TLS handshake.
    CHECK_FALSE(health_of(a.peer_address()).has_value());
    // Reflection lists every service and method: for grpcurl on the local control port, not for
    // anyone who reaches the peer port.
    CHECK(reflection_status(a.control_address()) == grpc::StatusCode::OK);
    CHECK(reflection_status(a.peer_address(), peer_port_credentials()) ==
          grpc::StatusCode::UNIMPLEMENTED);
    a.process().signal(SIGTERM);
    CHECK(a.process().wait(20s) == 0);
    CHECK_FALSE(health_of(a.peer_address(), peer_port_credentials()).has_value());
}

TEST_CASE(
    "a checkpoint that cannot be written shows in status and /metrics and is retried the next round",
    "[integration]") {
    TempDir root;
    TestDaemon a("a", root.path());
    std::filesystem::create_directories(a.data_dir());
    // A file where the checkpoint directory goes: every save fails, as on a full disk.
    const std::filesystem::path checkpoints = a.data_dir() / "checkpoints";
    std::ofstream(checkpoints) << "in the way";
    a.start();
    std::string failure;
    eventually("a checkpoint failure in status", 60s, [&] {
        try {
            failure = a.status().value("last_failure", "");
        } catch (const std::exception&) {
            return false;
        }
        return failure.find("checkpoint of round") != std::string::npos;
    });
    CHECK(failure.find(checkpoints.string()) != std::string::npos);
    const auto failing_since = std::chrono::steady_clock::now();
    double failures = 0;
    eventually("five failures counted in /metrics", 60s, [&] {
        failures = sample_value(http_get(a.metrics_port(), "/metrics"),
                                R"(starling_failures_total{reason="checkpoint"})")
                       .value_or(0.0);
        return failures >= 5.0;
    });
    // Every round's failure is counted, but the log has a line a minute of them, not one each.
    const auto minutes = std::chrono::duration_cast<std::chrono::minutes>(
                             std::chrono::steady_clock::now() - failing_since)
                             .count();
    const std::string log = a.log();
    size_t lines = 0;
    for (size_t at = log.find("failed in a row"); at != std::string::npos;
         at = log.find("failed in a row", at + 1))
        lines++;
    CHECK(lines >= 1);
    CHECK(lines <= static_cast<size_t>(2 + minutes));

    std::filesystem::remove(checkpoints);
    eventually("the next round's checkpoint is written", 60s, [&] {
        const nlohmann::json s = a.status();
        return s.contains("checkpoint_round") && s.value("last_failure", "").empty();
    });
    CHECK(std::filesystem::is_directory(checkpoints));
    CHECK(a.log().find("round(s) of failed checkpoints") != std::string::npos);
    a.process().signal(SIGTERM);
    CHECK(a.process().wait(20s) == 0);
}
