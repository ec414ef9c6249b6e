#include "tests/integration/daemon_harness.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <deque>
#include <fstream>
#include <mutex>
#include <regex>
#include <sstream>
#include <stdexcept>

#include "tests/support/kjv.h"

namespace starling::test {

std::string starlingd_binary() { return std::string(STARLING_BINARY_DIR) + "/bin/starlingd"; }
std::string faulty_starlingd_binary() {
    return std::string(STARLING_BINARY_DIR) + "/bin/faulty_starlingd";
}
std::string starling_binary() { return std::string(STARLING_BINARY_DIR) + "/bin/starling"; }
std::string pico_config() { return std::string(STARLING_SOURCE_DIR) + "/configs/pico.toml"; }

Environment daemon_environment() {
    return {
        {"STARLING_PEER_SECRET", "integration test secret"},
        {"STARLING_PEER_SWARM_ID", "integration"},
        {"STARLING_DATA_DIR", kjv_dir()},
        {"STARLING_TRAIN_THREADS", "1"},
        {"STARLING_TRAIN_BATCH_SIZE", "8"},
        {"STARLING_TRAIN_SEQ_LEN", "32"},
        {"STARLING_TRAIN_STEPS", "100000"},
        {"STARLING_SWARM_INNER_STEPS", "8"},
        {"STARLING_SWARM_CHECKPOINT_EVERY", "2"},
        {"STARLING_SWARM_EVAL_EVERY", "0"},
        {"STARLING_SWARM_JOIN_TIMEOUT_S", "10"},
        {"STARLING_SWARM_PACE_TIMEOUT_S", "5"},
        {"STARLING_PEER_GOSSIP_INTERVAL_MS", "100"},
        {"STARLING_PEER_PROBE_TIMEOUT_MS", "1000"},
        {"STARLING_PEER_SUSPICION_TIMEOUT_MS", "5000"},
        {"STARLING_PEER_PAIR_TIMEOUT_MS", std::to_string(kPairTimeoutMs)},
        {"STARLING_PEER_EXCHANGE_TIMEOUT_MS", std::to_string(kExchangeTimeoutMs)},
    };
}

namespace {

std::mutex logs_mutex;
std::filesystem::path logs_root;  // the directory of the latest TestDaemon's log

}  // namespace

std::string daemon_log_tails() {
    std::filesystem::path root;
    {
        std::lock_guard lock(logs_mutex);
        root = logs_root;
    }
    std::error_code error;
    std::string text;
    for (const auto& entry : std::filesystem::directory_iterator(root, error)) {
        if (entry.path().extension() != ".log") continue;
        std::ifstream in(entry.path());
        std::deque<std::string> last;
        for (std::string line; std::getline(in, line);) {
            last.push_back(line);
            if (last.size() > 20) last.pop_front();
        }
        text += "--- last lines of " + entry.path().filename().string() + ":\n";
        for (const std::string& line : last) text += line + "\n";
    }
    return text;
}

TestDaemon::TestDaemon(std::string name, const std::filesystem::path& root)
    : name_(std::move(name)),
      data_dir_(root / name_),
      log_path_(root / (name_ + ".log")),
      peer_port_(free_port()),
      control_port_(free_port()),
      metrics_port_(free_port()) {
    std::lock_guard lock(logs_mutex);
    logs_root = root;
}

void TestDaemon::start(const std::vector<std::string>& seeds, const Environment& extra,
                       const std::string& config) {
    std::vector<std::string> argv = command_;
    argv.insert(argv.end(), {"--config", config, "--data-dir", data_dir_.string(), "--listen",
                             peer_address(), "--control", control_address(), "--metrics",
                             "127.0.0.1:" + std::to_string(metrics_port_)});
    for (const std::string& seed : seeds) {
        argv.push_back("--seed");
        argv.push_back(seed);
    }
    Environment env = daemon_environment();
    for (const auto& [key, value] : extra) env[key] = value;
    process_ = std::make_unique<Process>(argv, env, log_path_);
}

std::string TestDaemon::log() const {
    std::ifstream in(log_path_);
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
}

CommandResult TestDaemon::cli(const std::vector<std::string>& args) const {
    std::vector<std::string> argv{starling_binary(), "--control", control_address()};
    argv.insert(argv.end(), args.begin(), args.end());
    return run_command(argv);
}

namespace {

nlohmann::json json_of(const CommandResult& result, const std::string& what) {
    if (result.status != 0)
        throw std::runtime_error(what + " exited " + std::to_string(result.status) + ": " +
                                 result.output);
    return nlohmann::json::parse(result.output);
}

}  // namespace

nlohmann::json TestDaemon::status() const {
    return json_of(cli({"status", "--json"}), name_ + ": starling status");
}

nlohmann::json TestDaemon::peers() const {
    return json_of(cli({"peers", "--json"}), name_ + ": starling peers");
}

uint64_t json_u64(const nlohmann::json& value) {
    if (value.is_string()) return std::stoull(value.get<std::string>());
    return value.get<uint64_t>();
}

uint64_t status_u64(const TestDaemon& daemon, const char* key) {
    try {
        const nlohmann::json s = daemon.status();
        return s.contains(key) ? json_u64(s[key]) : 0;
    } catch (const std::exception&) {
        return 0;
    }
}

std::vector<LoggedRound> logged_rounds(const std::string& log) {
    static const std::regex line(
        R"(round (\d+) \| loss ([0-9.]+) \| partner (\S+) \| .* \| pair ([0-9.]+) s, exchange ([0-9.]+) s)");
    std::vector<LoggedRound> rounds;
    std::istringstream in(log);
    std::string text;
    std::smatch m;
    while (std::getline(in, text)) {
        if (!std::regex_search(text, m, line)) continue;
        rounds.push_back(
            {std::stoull(m[1]), std::stod(m[2]), std::stod(m[4]), std::stod(m[5]), m[3] != "none"});
    }
    return rounds;
}

std::map<uint64_t, double> logged_val_losses(const std::string& log) {
    static const std::regex line(R"(round (\d+): validation loss of the averaged weights (\S+))");
    std::map<uint64_t, double> losses;
    std::istringstream in(log);
    std::string text;
    std::smatch m;
    while (std::getline(in, text))
        if (std::regex_search(text, m, line)) losses[std::stoull(m[1])] = std::stod(m[2]);
    return losses;
}

std::vector<LoggedRound> logged_diloco_rounds(const std::string& log) {
    static const std::regex line(R"(round (\d+) \| loss ([0-9.]+) \| quorum (\d+))");
    std::vector<LoggedRound> rounds;
    std::istringstream in(log);
    std::string text;
    std::smatch m;
    while (std::getline(in, text))
        if (std::regex_search(text, m, line))
            rounds.push_back({std::stoull(m[1]), std::stod(m[2]), 0.0, 0.0, std::stoi(m[3]) > 1});
    return rounds;
}

std::string http_get(int port, const std::string& path) {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    address.sin_port = htons(static_cast<uint16_t>(port));
    std::string answer;
    if (fd >= 0 && connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0) {
        const std::string request = "GET " + path + " HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
        if (write(fd, request.data(), request.size()) == static_cast<ssize_t>(request.size())) {
            char buffer[4096];
            ssize_t n;
            while ((n = read(fd, buffer, sizeof(buffer))) > 0)
                answer.append(buffer, static_cast<size_t>(n));
        }
    }
    if (fd >= 0) close(fd);
    const size_t body = answer.find("\r\n\r\n");
    return body == std::string::npos ? "" : answer.substr(body + 4);
}

}  // namespace starling::test
