#include "bench/iperf.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <thread>
#include <vector>

#include "bench/median.h"
#include "common/error.h"

extern char** environ;

namespace starling::bench {
namespace {

// Starts args[0] from PATH with its stdout on `stdout_fd`; stderr stays ours.
pid_t spawn(const std::vector<std::string>& args, int stdout_fd) {
    std::vector<char*> argv;
    for (const auto& arg : args) argv.push_back(const_cast<char*>(arg.c_str()));
    argv.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, stdout_fd, STDOUT_FILENO);
    pid_t pid = 0;
    const int failed = posix_spawnp(&pid, argv[0], &actions, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    if (failed) throw Error("cannot run " + args[0]);
    return pid;
}

// Runs args to the end and returns what it printed on stdout.
std::string output_of(const std::vector<std::string>& args) {
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0) throw Error("cannot make a pipe for " + args[0]);
    const pid_t pid = spawn(args, fds[1]);
    close(fds[1]);
    std::string output;
    char buffer[1 << 14];
    for (ssize_t n; (n = read(fds[0], buffer, sizeof buffer)) > 0;) output.append(buffer, n);
    close(fds[0]);
    waitpid(pid, nullptr, 0);
    return output;
}

// One client run; bits per second received, summed over both directions with --bidir. The
// coreutils timeout bounds a run whose server stops answering.
double client_run(const std::string& host, uint16_t port, int seconds, bool bidir) {
    std::vector<std::string> args = {
        "timeout", std::to_string(seconds + 30), "iperf3", "-c", host, "-p", std::to_string(port),
        "-t",      std::to_string(seconds),      "-J"};
    if (bidir) args.push_back("--bidir");
    const std::string output = output_of(args);
    const auto doc = nlohmann::json::parse(output, nullptr, false);
    if (doc.is_discarded())
        throw Error("iperf3 printed no JSON (is it installed? scripts/setup installs it): " +
                    output.substr(0, 200));
    if (doc.contains("error"))
        throw Error("iperf3 to " + host + ":" + std::to_string(port) + ": " + doc["error"].dump());
    try {
        const auto& end = doc.at("end");
        double bps = end.at("sum_received").at("bits_per_second").get<double>();
        if (bidir) bps += end.at("sum_received_bidir_reverse").at("bits_per_second").get<double>();
        return bps;
    } catch (const nlohmann::json::exception& e) {
        throw Error(std::string("iperf3's JSON lacks the received rate: ") + e.what());
    }
}

// A server that is not listening yet, or still finishing the previous run (its end crosses a
// relay's delay), refuses a client for a moment: the client tries again for up to 5 s.
double client_run_patiently(const std::string& host, uint16_t port, int seconds, bool bidir) {
    for (int attempt = 0;; ++attempt) {
        try {
            return client_run(host, port, seconds, bidir);
        } catch (const Error& e) {
            const std::string error = e.what();
            const bool refused = error.find("unable to connect") != std::string::npos ||
                                 error.find("busy") != std::string::npos;
            if (!refused || attempt == 50) throw;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
}

uint16_t free_loopback_port() {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t size = sizeof addr;
    const bool bound = bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
                       getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &size) == 0;
    close(fd);
    if (!bound) throw Error("no free port on 127.0.0.1 for iperf3");
    return ntohs(addr.sin_port);
}

// A one-shot server exits after its client; one that does not within a few seconds is ended.
void reap(pid_t server) {
    for (int waited_ms = 0; waited_ms < 5000; waited_ms += 50) {
        if (waitpid(server, nullptr, WNOHANG) == server) return;
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    kill(server, SIGTERM);
    waitpid(server, nullptr, 0);
}

double loopback_run(int seconds, bool bidir) {
    const uint16_t port = free_loopback_port();
    const int devnull = open("/dev/null", O_WRONLY | O_CLOEXEC);
    const pid_t server = spawn({"iperf3", "-s", "-1", "-p", std::to_string(port)}, devnull);
    close(devnull);
    try {
        const double bps = client_run_patiently("127.0.0.1", port, seconds, bidir);
        reap(server);
        return bps;
    } catch (const Error&) {
        kill(server, SIGTERM);
        waitpid(server, nullptr, 0);
        throw;
    }
}

template <typename Run>
TcpRates medians(int reps, Run&& run) {
    std::vector<double> one_way, bidir;
    for (int r = 0; r < reps; ++r) one_way.push_back(run(false));
    for (int r = 0; r < reps; ++r) bidir.push_back(run(true));
    return {median(one_way), median(bidir)};
}

}  // namespace

TcpRates iperf3_rates(const std::string& host, uint16_t port, int seconds, int reps) {
    return medians(reps,
                   [&](bool bidir) { return client_run_patiently(host, port, seconds, bidir); });
}

TcpRates iperf3_loopback_rates(int seconds, int reps) {
    return medians(reps, [&](bool bidir) { return loopback_run(seconds, bidir); });
}

}  // namespace starling::bench
