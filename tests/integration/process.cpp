#include "tests/integration/process.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <thread>

extern char** environ;

namespace starling::test {

namespace {

// Forks and execs argv with the merged environment, stdout and stderr on `out_fd`.
pid_t spawn(const std::vector<std::string>& argv, const Environment& env, int out_fd) {
    std::map<std::string, std::string> merged;
    for (char** e = environ; *e; ++e) {
        const std::string entry(*e);
        const size_t eq = entry.find('=');
        if (eq != std::string::npos) merged[entry.substr(0, eq)] = entry.substr(eq + 1);
    }
    for (const auto& [key, value] : env) merged[key] = value;
    std::vector<std::string> env_strings;
    for (const auto& [key, value] : merged) env_strings.push_back(key + "=" + value);
    std::vector<char*> env_ptrs, arg_ptrs;
    for (auto& s : env_strings) env_ptrs.push_back(s.data());
    env_ptrs.push_back(nullptr);
    std::vector<std::string> args = argv;
    for (auto& s : args) arg_ptrs.push_back(s.data());
    arg_ptrs.push_back(nullptr);

    const pid_t pid = fork();
    if (pid < 0) throw std::runtime_error("fork failed");
    if (pid == 0) {
        dup2(out_fd, STDOUT_FILENO);
        dup2(out_fd, STDERR_FILENO);
        execve(arg_ptrs[0], arg_ptrs.data(), env_ptrs.data());
        _exit(127);
    }
    return pid;
}

int decode(int status) { return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status); }

}  // namespace

Process::Process(const std::vector<std::string>& argv, const Environment& env,
                 const std::filesystem::path& log)
    : log_(log) {
    const int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0) throw std::runtime_error("cannot open " + log.string());
    pid_ = spawn(argv, env, fd);
    close(fd);
}

Process::~Process() {
    if (running()) {
        kill(pid_, SIGKILL);
        wait(std::chrono::seconds(10));
    }
}

void Process::signal(int number) {
    if (!status_) kill(pid_, number);
}

std::optional<int> Process::wait(std::chrono::milliseconds limit) {
    const auto deadline = std::chrono::steady_clock::now() + limit;
    while (!status_) {
        int status = 0;
        if (waitpid(pid_, &status, WNOHANG) == pid_) {
            status_ = decode(status);
            break;
        }
        if (std::chrono::steady_clock::now() >= deadline) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return status_;
}

bool Process::running() { return !wait(std::chrono::milliseconds(0)); }

std::string Process::log() const {
    std::ifstream in(log_);
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
}

CommandResult run_command(const std::vector<std::string>& argv, const Environment& env,
                          std::chrono::milliseconds limit) {
    char path[] = "/tmp/starling-command-XXXXXX";
    const int fd = mkstemp(path);
    if (fd < 0) throw std::runtime_error("mkstemp failed");
    const pid_t pid = spawn(argv, env, fd);
    close(fd);
    const auto deadline = std::chrono::steady_clock::now() + limit;
    int status = 0;
    while (waitpid(pid, &status, WNOHANG) != pid) {
        if (std::chrono::steady_clock::now() >= deadline) {
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
            break;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    CommandResult result;
    result.status = decode(status);
    std::ifstream in(path);
    std::stringstream text;
    text << in.rdbuf();
    result.output = text.str();
    unlink(path);
    return result;
}

namespace {

// Whether a listening socket could take 127.0.0.1:port now.
bool bindable(int port) {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return false;
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    address.sin_port = htons(static_cast<uint16_t>(port));
    const bool free = bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0;
    close(fd);
    return free;
}

// The lowest port the kernel hands to outgoing connections (ip_local_port_range).
int first_ephemeral_port() {
    std::ifstream range("/proc/sys/net/ipv4/ip_local_port_range");
    int low = 32768;
    range >> low;
    return low;
}

}  // namespace

// Every outgoing connection's local port comes from the kernel's ephemeral range: a port taken
// from it (a bind to port 0) and freed again could be some connection's by the time a daemon
// listens on it, and under load it was ("cannot listen on 127.0.0.1:P: Address already in use",
// and a test waited 600 s for a daemon that never started). So ports come from below that
// range, each process walking its own block first (ctest runs tests in parallel processes), each
// checked free by binding it.
int free_port() {
    static std::mutex mutex;
    static int next = 0;
    constexpr int kFirst = 10000, kBlock = 64;
    const std::lock_guard<std::mutex> lock(mutex);
    const int last = first_ephemeral_port();
    if (last - kFirst < kBlock) throw std::runtime_error("no ports below the ephemeral range");
    const int blocks = (last - kFirst) / kBlock;
    if (next == 0) next = kFirst + static_cast<int>(getpid() % blocks) * kBlock;
    for (int tried = 0; tried < last - kFirst; tried++) {
        const int port = next;
        next = next + 1 < last ? next + 1 : kFirst;
        if (bindable(port)) return port;
    }
    throw std::runtime_error("no free port below the ephemeral range");
}

}  // namespace starling::test
