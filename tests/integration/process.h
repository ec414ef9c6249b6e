// Real processes for the integration tests: starlingd started as an operator starts it (its own
// environment, its output in a log file), signals, exit statuses, and CLI runs with their output.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace starling::test {

using Environment = std::map<std::string, std::string>;

class Process {
public:
    // Starts argv[0] with the test's environment plus `env`, stdout and stderr into `log`.
    Process(const std::vector<std::string>& argv, const Environment& env,
            const std::filesystem::path& log);
    ~Process();  // SIGKILL and reap if still running
    Process(const Process&) = delete;
    Process& operator=(const Process&) = delete;

    void signal(int number);
    // The exit status (or 128 + signal number) once it has ended within `limit`, else nullopt.
    std::optional<int> wait(std::chrono::milliseconds limit);
    bool running();
    std::string log() const;  // everything it has printed so far
    pid_t pid() const { return pid_; }

private:
    pid_t pid_ = -1;
    std::optional<int> status_;
    std::filesystem::path log_;
};

struct CommandResult {
    int status = -1;     // exit status, or 128 + signal number
    std::string output;  // stdout and stderr together
};

// Runs a command to its end (killed after `limit`) and returns its status and output.
CommandResult run_command(const std::vector<std::string>& argv, const Environment& env = {},
                          std::chrono::milliseconds limit = std::chrono::seconds(30));

// A TCP port on 127.0.0.1 that nothing listened on a moment ago, below the kernel's range for
// outgoing connections' ports (so none of those can take it before the daemon listens).
int free_port();

}  // namespace starling::test
