#include "cli/node_commands.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <thread>

#include "cli/control_client.h"
#include "cli/status_format.h"

namespace starling::cli {

namespace {

// Prints what a failed call means and returns its exit status.
int report(const grpc::Status& status, bool unary, const ControlClient& client) {
    std::fprintf(stderr, "%s\n", failure_message(status, unary, client.address()).c_str());
    return exit_code_for(status, unary);
}

// Ctrl-C and SIGTERM end a watch with its stream closed properly. A signal handler may not call
// into gRPC, so the signals are blocked in every thread (BlockedStopSignals) and taken by one
// thread of ours (StopOnSignal) that stops the client.

// Blocks SIGINT and SIGTERM while it lives. Construct it before the client: gRPC's threads start
// with the channel and must inherit the mask, or the default action would end the process from
// one of them.
class BlockedStopSignals {
public:
    BlockedStopSignals() {
        sigemptyset(&signals_);
        for (const int signal : {SIGINT, SIGTERM}) {
            // One the caller ignores (nohup, a background job) stays ignored: a blocked signal
            // would be queued for the waiting thread even so.
            struct sigaction action {};
            sigaction(signal, nullptr, &action);
            if (action.sa_handler != SIG_IGN) sigaddset(&signals_, signal);
        }
        pthread_sigmask(SIG_BLOCK, &signals_, &previous_);
    }
    ~BlockedStopSignals() { pthread_sigmask(SIG_SETMASK, &previous_, nullptr); }
    BlockedStopSignals(const BlockedStopSignals&) = delete;
    BlockedStopSignals& operator=(const BlockedStopSignals&) = delete;

    const sigset_t& signals() const { return signals_; }

private:
    sigset_t signals_{};
    sigset_t previous_{};
};

// Stops the client when one of the blocked signals arrives. Must end before the client does.
class StopOnSignal {
public:
    StopOnSignal(const BlockedStopSignals& blocked, ControlClient& client)
        : waiter_([this, &blocked, &client] {
              // A timed wait, so the thread notices within that time that the watch is over.
              const timespec poll{0, 100'000'000};
              while (!done_)
                  if (sigtimedwait(&blocked.signals(), nullptr, &poll) > 0) client.stop();
          }) {}
    ~StopOnSignal() {
        done_ = true;
        waiter_.join();
    }
    StopOnSignal(const StopOnSignal&) = delete;
    StopOnSignal& operator=(const StopOnSignal&) = delete;

private:
    std::atomic<bool> done_{false};
    std::thread waiter_;  // after done_: it reads done_ from its first instruction
};

void print_update(const v1::NodeStatus& status, bool terminal, const WatchOptions& options,
                  const std::string& address) {
    if (terminal) {
        // Clear the screen and move home, then the whole table again: a live view, not a scroll.
        std::fputs("\x1b[H\x1b[2J", stdout);
        std::fputs(format_status(status).c_str(), stdout);
        const uint32_t interval = options.interval_ms == 0 ? 1000 : options.interval_ms;
        std::printf("\nwatching %s every %u ms; Ctrl-C to stop\n", address.c_str(), interval);
    } else {
        std::printf("%s\n", format_status_line(status).c_str());
    }
    std::fflush(
        stdout);  // a pipe is block-buffered; whoever reads it wants each update as it comes
}

}  // namespace

int run_status(const std::string& control, bool json) {
    ControlClient client(control);
    v1::NodeStatus status;
    const grpc::Status result = client.get_status(status);
    if (!result.ok()) return report(result, true, client);
    std::fputs((json ? to_json(status) + "\n" : format_status(status)).c_str(), stdout);
    return kExitOk;
}

int run_peers(const std::string& control, bool json) {
    ControlClient client(control);
    v1::ListPeersResponse peers;
    const grpc::Status result = client.list_peers(peers);
    if (!result.ok()) return report(result, true, client);
    std::fputs((json ? to_json(peers) + "\n" : format_peers(peers)).c_str(), stdout);
    return kExitOk;
}

int run_watch(const std::string& control, const WatchOptions& options) {
    const BlockedStopSignals blocked;  // before the client, see BlockedStopSignals
    ControlClient client(control);
    const StopOnSignal stop_on_signal(blocked, client);
    const bool terminal = isatty(STDOUT_FILENO) == 1;
    grpc::Status status;
    const WatchEnd end = client.watch(
        options.interval_ms, options.count,
        [&](const v1::NodeStatus& update) {
            print_update(update, terminal, options, client.address());
        },
        status);
    switch (end) {
        case WatchEnd::Counted:
        case WatchEnd::Stopped: return kExitOk;
        case WatchEnd::NodeLeft:
            std::fprintf(stderr, "starlingd at %s ended the stream: it left the swarm or exited\n",
                         client.address().c_str());
            return kExitOk;
        case WatchEnd::Failed: break;
    }
    return report(status, false, client);
}

int run_join(const std::string& control, const std::vector<std::string>& seeds) {
    for (const std::string& seed : seeds) {
        if (!is_seed_address(seed)) {
            std::fprintf(
                stderr, "error: seed '%s' is not host:port (or [v6]:port) with a port of 1-65535\n",
                seed.c_str());
            return kExitError;
        }
    }
    ControlClient client(control);
    v1::JoinSwarmResponse response;
    const grpc::Status result = client.join(seeds, response);
    if (!result.ok()) return report(result, true, client);
    // The node dialled each seed before it answered; it keeps only those that answered.
    for (const v1::SeedOutcome& outcome : response.seeds()) {
        if (outcome.joined())
            std::printf("starlingd at %s joined the swarm through %s\n", client.address().c_str(),
                        outcome.seed().c_str());
        else
            std::fprintf(stderr, "error: starlingd at %s cannot join through seed %s: %s\n",
                         client.address().c_str(), outcome.seed().c_str(), outcome.error().c_str());
    }
    return response.seeds_added() == static_cast<uint32_t>(response.seeds_size()) ? kExitOk
                                                                                  : kExitError;
}

int run_leave(const std::string& control) {
    ControlClient client(control);
    const grpc::Status result = client.leave();
    if (!result.ok()) return report(result, true, client);
    std::printf(
        "starlingd at %s is draining: it finishes the round, writes a checkpoint, tells its peers it "
        "is leaving and exits\n",
        client.address().c_str());
    return kExitOk;
}

}  // namespace starling::cli
