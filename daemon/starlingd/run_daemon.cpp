#include "daemon/starlingd/run_daemon.h"

#include <asio.hpp>
#include <CLI/CLI.hpp>
#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/health_check_service_interface.h>
#include <spdlog/spdlog.h>

#include <sys/resource.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <thread>

#include "common/error.h"
#include "engine/config_reader.h"
#include "daemon/data_dir_lock.h"
#include "daemon/service/control_service.h"
#include "daemon/service/log_format.h"
#include "daemon/service/metrics.h"
#include "common/allocator.h"
#include "common/openmp_wait.h"
#include "daemon/service/node_runner.h"
#include "daemon/service/systemd_notify.h"
#include "daemon/swarm/node_config.h"
#include "data/tokenizer.h"

namespace {

using namespace starling;

// The data directory must exist and take files before anything is written to it.
void prepare_data_dir(const std::filesystem::path& dir) {
    std::error_code error;
    std::filesystem::create_directories(dir, error);
    if (error)
        throw Error("[node].data_dir " + dir.string() + ": cannot be created (" + error.message() +
                    ")");
    const std::filesystem::path probe = dir / ".starlingd-write-test";
    if (!std::ofstream(probe).good())
        throw Error("[node].data_dir " + dir.string() + ": not writable by this user");
    std::filesystem::remove(probe, error);
}

// Every peer connection holds a descriptor, and systemd's default soft limit (1024) is far below
// its hard one: take the hard one, so a flood of connections meets gRPC's limits, not EMFILE in
// the middle of a round.
void raise_open_file_limit() {
    rlimit limit{};
    if (getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur >= limit.rlim_max) return;
    const rlim_t before = limit.rlim_cur;
    limit.rlim_cur = limit.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &limit) == 0)
        spdlog::debug("open file limit raised from {} to {}", before, limit.rlim_cur);
}

NodeConfig load(const std::string& path, const NodeFlags& flags) {
    NodeConfig config = load_node_config(path);
    apply_node_flags(flags, config);
    return config;
}

// SIGINT, SIGTERM and SIGHUP, caught from before the node starts: one that arrives while it is
// still starting (resuming a checkpoint, joining) waits in the set and drains the node once the
// event loop runs, where its default action would have killed the process (exit 143).
struct CaughtSignals {
    asio::io_context io;
    asio::signal_set set{io, SIGINT, SIGTERM, SIGHUP};
};

// The event loop: signals, the once-a-second tick, and the end of the round loop.
class EventLoop {
public:
    EventLoop(CaughtSignals& signals, NodeRunner& runner, const ControlServer& control,
              std::function<void()> drain, NodeMetrics* metrics, std::string config_path,
              NodeFlags flags)
        : io_(signals.io),
          signals_(signals.set),
          runner_(runner),
          control_(control),
          drain_(std::move(drain)),
          metrics_(metrics),
          config_path_(std::move(config_path)),
          flags_(std::move(flags)),
          tick_(io_),
          watchdog_(watchdog_interval()) {}

    // Runs until the round loop has drained; rethrows what ended it abnormally.
    void run() {
        wait_for_signal();
        on_tick();
        std::exception_ptr failure;
        std::thread rounds([&] {
            try {
                runner_.run();
            } catch (...) {
                failure = std::current_exception();
            }
            asio::post(io_, [this] { io_.stop(); });
        });
        notify_ready();
        io_.run();
        rounds.join();
        if (failure) std::rethrow_exception(failure);
    }

private:
    void wait_for_signal() {
        signals_.async_wait([this](const asio::error_code& error, int signal) {
            if (error) return;
            if (signal == SIGHUP) {
                reload();
            } else if (!runner_.draining()) {
                spdlog::info("signal {}: draining (a second one exits at once)", signal);
                drain_();
            } else {
                spdlog::warn("second signal {}: exiting without waiting for the drain", signal);
                std::_Exit(1);
            }
            wait_for_signal();
        });
    }

    void reload() {
        try {
            NodeConfig config = load(config_path_, flags_);
            spdlog::set_level(spdlog::level::from_str(config.log_level));
            use_log_format(config.log_format);
            runner_.reload(config);
        } catch (const std::exception& e) {
            spdlog::error("SIGHUP: {} (the running settings are kept)", e.what());
        }
    }

    void on_tick() {
        if (watchdog_) ping_watchdog_if_rounds_progress();
        const SwarmView swarm = runner_.node().view();
        const std::string line = runner_.state().summary(swarm);
        if (line != last_status_) notify_status(line);
        last_status_ = line;
        if (metrics_) {
            metrics_->record_peers(swarm);
            metrics_->record_failures(runner_.state().failures(swarm.failures));
            metrics_->record_control_connections_closed(control_.closed_connections());
        }
        release_free_memory_now_and_then();
        tick_.expires_after(
            watchdog_ ? std::min<std::chrono::microseconds>(*watchdog_, std::chrono::seconds(1))
                      : std::chrono::seconds(1));
        tick_.async_wait([this](const asio::error_code& error) {
            if (!error) on_tick();
        });
    }

    // The heap keeps freed buffers for reuse (common/allocator.h); once a minute its free pages go
    // back, so that the resident size follows what the node uses, not the largest burst of
    // buffers it ever had (several joiners' state copies at once, say).
    void release_free_memory_now_and_then() {
        const auto now = std::chrono::steady_clock::now();
        if (now - last_release_ < kReleaseFreeMemoryEvery) return;
        last_release_ = now;
        const bool released = release_free_memory();
        spdlog::debug(
            "heap: free pages {} in {:.2f} ms", released ? "released" : "none to release",
            std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - now)
                .count());
    }

    // The watchdog's interval is half of WatchdogSec; the round loop must have marked progress
    // within WatchdogSec (plus what its last mark allows), or systemd stops hearing from us.
    void ping_watchdog_if_rounds_progress() {
        const RoundWatch& watch = runner_.round_watch();
        if (watch.healthy(2 * *watchdog_)) {
            notify_watchdog();
            stalled_ = false;
        } else if (!stalled_) {
            stalled_ = true;
            spdlog::error(
                "the round loop has made no progress for {:.0f} s (phase {}): no more watchdog pings, so "
                "systemd restarts the service",
                watch.seconds_since_mark(), node_phase_name(runner_.state().phase()));
        }
    }

    asio::io_context& io_;
    asio::signal_set& signals_;
    NodeRunner& runner_;
    const ControlServer& control_;
    std::function<void()> drain_;
    NodeMetrics* metrics_;
    std::string config_path_;
    NodeFlags flags_;
    asio::steady_timer tick_;
    std::optional<std::chrono::microseconds> watchdog_;
    std::string last_status_;
    bool stalled_ = false;
    static constexpr std::chrono::seconds kReleaseFreeMemoryEvery{60};
    std::chrono::steady_clock::time_point last_release_ = std::chrono::steady_clock::now();
};

}  // namespace

namespace starling {

int run_daemon(int argc, char** argv) {
    restart_unless_openmp_wait_policy_set(argv);
    const bool buffers_kept = keep_freed_buffers_for_reuse();
    use_log_format("text");
    CLI::App app{"starlingd: one node of a Starling swarm, run as a service"};
    std::string config_path;
    NodeFlags flags;
    app.add_option("-c,--config", config_path,
                   "TOML config (configs/pico.toml, nano.toml, 124m.toml)")
        ->required();
    const std::vector<KeyDescription> keys = node_config_keys();
    app.add_option("--data-dir", flags.data_dir, key_help(keys, "node", "data_dir"));
    app.add_option("--listen", flags.listen, key_help(keys, "peer", "listen"));
    app.add_option("--announce", flags.announce, key_help(keys, "peer", "announce"));
    app.add_option("--seed", flags.seeds, "HOST:PORT of a member to join through (repeatable)");
    app.add_option("--control", flags.control, key_help(keys, "control", "listen"));
    app.add_option("--metrics", flags.metrics, key_help(keys, "metrics", "listen"));
    app.add_option("--log-level", flags.log_level, key_help(keys, "node", "log_level"));
    app.add_option("--log-format", flags.log_format, key_help(keys, "node", "log_format"));
    app.footer(
        "\nConfig keys (TOML [section] key = default; each also STARLING_<SECTION>_<KEY>):\n" +
        keys_as_text(keys));
    app.set_version_flag("--version", "starlingd " STARLING_VERSION);
    try {
        app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
        return app.exit(e) == 0 ? 0
                                : 1;  // --help is 0; any mistake on the command line is bad input
    }

    try {
        CaughtSignals signals;
        const NodeConfig config = load(config_path, flags);
        spdlog::set_level(spdlog::level::from_str(config.log_level));
        use_log_format(config.log_format);
        // After --help and --version, which print nothing else, and in the configured format.
        if (!buffers_kept)
            spdlog::warn(
                "malloc refused to keep freed buffers for reuse; exchanges will run slower");
        warn_unknown_starling_variables();
        if (const std::string warning = config.swarm.settings_warning(); !warning.empty())
            spdlog::warn("{}", warning);
        raise_open_file_limit();
        prepare_data_dir(config.data_dir);
        const DataDirLock data_dir_lock(config.data_dir);  // held until the process ends
        // Before the peer server is built, so Kubernetes can probe the peer port.
        grpc::EnableDefaultHealthCheckService(true);
        std::unique_ptr<NodeMetrics> metrics;
        if (!config.metrics_listen.empty())
            metrics = std::make_unique<NodeMetrics>(config.metrics_listen);
        NodeRunner runner(config, STARLING_VERSION, metrics.get());
        // For grpcurl on the Control server; the peer server takes it out of its own builder.
        grpc::reflection::InitProtoReflectionServerBuilderPlugin();
        std::unique_ptr<ControlServer> control;
        std::atomic<ControlServer*> serving_control{
            nullptr};  // a Leave may arrive while it is built
        // A signal or `starling leave`: health says NOT_SERVING at once, then the round loop
        // drains.
        auto drain = [&] {
            notify_stopping();
            runner.node().set_serving(false);
            if (ControlServer* c = serving_control.load()) c->set_serving(false);
            runner.request_drain();
        };
        control = std::make_unique<ControlServer>(
            config.control_listen, runner.state(), runner.node(), config.swarm.train.model,
            load_tokenizer(config.swarm.train.data.tokenizer)->hf_json(),
            ControlHandlers{[&](const std::vector<std::string>& seeds,
                                std::chrono::steady_clock::time_point by) {
                                return runner.node().join_seeds(seeds, by);
                            },
                            drain});
        serving_control = control.get();
        spdlog::info("starlingd {}: node {} on {}, swarm \"{}\", model {}, control {}, metrics {}",
                     STARLING_VERSION, format_node_id(runner.node().node_id()),
                     runner.node().address(), config.swarm.peer.swarm_id,
                     runner.node().replica().manifest().fingerprint(), control->address(),
                     config.metrics_listen.empty() ? "off" : config.metrics_listen);
        EventLoop(signals, runner, *control, drain, metrics.get(), config_path, flags).run();
        control->shutdown(std::chrono::milliseconds(1000));
        spdlog::info("starlingd: left the swarm, exiting");
        return 0;
    } catch (const std::exception& e) {  // starling::Error, and anything the libraries throw
        std::fprintf(stderr, "error: %s\n", e.what());
        return 1;
    }
}

// gRPC's own threads (its event engine's) outlive every gRPC object and may log at any time,
// through spdlog (peer/grpc_log.h). Returning from main would destroy spdlog's and gRPC's statics
// under them: a node exiting after a drain once died of SIGSEGV in such a thread. So the daemon
// ends, once everything it owns has been shut down and its logs flushed, without static
// destructors.
void end_process(int status) {
    spdlog::default_logger()->flush();
    std::fflush(stdout);
    std::fflush(stderr);
    std::_Exit(status);
}

}  // namespace starling
