#include "cli/check.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fmt/format.h>
#include <numeric>
#include <thread>

#include "cli/check_network.h"
#include "cli/status_format.h"
#include "common/errno_text.h"
#include "common/error.h"
#include "engine/config_reader.h"
#include "daemon/data_dir_lock.h"
#include "data/prepare.h"
#include "data/shard.h"
#include "data/tokenizer.h"
#include "kernels/backend.h"
#include "peer/tls.h"

namespace starling::cli {

namespace fs = std::filesystem;

namespace {

const char* level_word(CheckLevel level) {
    switch (level) {
        case CheckLevel::Ok: return "ok";
        case CheckLevel::Warn: return "warn";
        case CheckLevel::Fail: return "FAIL";
    }
    return "?";
}

std::string gpu_summary(int devices, const std::string& reason) {
    return devices > 0 ? fmt::format("{} {}CUDA device(s) usable", devices,
                                     cuda_devices_emulated() ? "emulated " : "")
                       : "no usable GPU (" + reason + ")";
}

// The tokens in the dir's shards of one split; opening a shard validates its header and size.
uint64_t count_tokens(const std::vector<std::string>& paths) {
    uint64_t tokens = 0;
    for (const std::string& path : paths) tokens += Shard(path).size();
    return tokens;
}

// The nearest directory that exists at or above dir: where starlingd would create the rest.
fs::path existing_ancestor(const fs::path& dir) {
    fs::path at = fs::absolute(dir);
    while (true) {
        std::error_code error;
        const bool there = fs::exists(at, error);
        if (error) throw Error(fmt::format("cannot inspect {}: {}", at.string(), error.message()));
        if (there || at == at.root_path()) return at;
        at = at.parent_path();
    }
}

// "" when a file can be created (and is removed again) in dir, else why not.
std::string write_problem(const fs::path& dir) {
    const fs::path probe = dir / fmt::format(".starling-check-{}", getpid());
    const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) return errno_text(errno);
    ::close(fd);
    ::unlink(probe.c_str());
    return "";
}

}  // namespace

std::string format_check(const CheckResult& result) {
    std::string text =
        fmt::format("{:<4}  {}: {}\n", level_word(result.level), result.name, result.detail);
    if (result.level != CheckLevel::Ok) text += fmt::format("      fix: {}\n", result.fix);
    return text;
}

CheckResult check_device(const NodeConfig& config) {
    const TrainConfig& train = config.swarm.train;
    const std::string threads = train.threads == 0 ? "all" : std::to_string(train.threads);
    const std::string cpu = fmt::format("the CPU, {} core(s), [train].threads = {}",
                                        std::thread::hardware_concurrency(), threads);
    if (train.device == "cpu") return {CheckLevel::Ok, "device", "cpu: " + cpu, ""};
    std::string reason;
    const int devices = usable_cuda_devices(&reason);  // 0, never a throw, without a driver
    const DeviceChoice choice = parse_device(train.device);
    std::vector<int> gpus = choice.gpus;
    if (choice.all_gpus) {
        gpus.resize(static_cast<size_t>(devices));
        std::iota(gpus.begin(), gpus.end(), 0);
    }
    const auto missing =
        std::find_if(gpus.begin(), gpus.end(), [&](int gpu) { return gpu >= devices; });
    if (choice.kind == DeviceChoice::Kind::Cuda && (gpus.empty() || missing != gpus.end())) {
        const std::string which = gpus.empty() ? train.device : "cuda:" + std::to_string(*missing);
        return {
            CheckLevel::Fail, "device",
            fmt::format("{}: not available, {}", which, gpu_summary(devices, reason)),
            "set [train].device to \"auto\" (a GPU when there is one, else the CPU) or \"cpu\""};
    }
    if (gpus.size() > 1 && train.batch_size % static_cast<int>(gpus.size()) != 0) {
        return {CheckLevel::Fail, "device",
                fmt::format("{}: [train].batch_size {} does not split evenly over {} GPUs",
                            train.device, train.batch_size, gpus.size()),
                fmt::format("make [train].batch_size a multiple of {}", gpus.size())};
    }
    if (choice.kind == DeviceChoice::Kind::Cuda) {
        const std::string runs_on =
            gpus.size() > 1 ? fmt::format("trains on {} GPUs, data-parallel", gpus.size())
                            : "trains on that GPU";
        return {CheckLevel::Ok, "device",
                fmt::format("{}: {}; {}", train.device, runs_on, gpu_summary(devices, reason)), ""};
    }
    // "auto", in the words of the trainer's own log line about it (kernels/backend.h).
    std::string auto_reason;
    if (auto_cuda_devices(&auto_reason) > 0)
        return {CheckLevel::Ok, "device",
                fmt::format("{}: trains on GPU 0; {}", train.device, gpu_summary(devices, reason)),
                ""};
    return {CheckLevel::Ok, "device",
            fmt::format("{}: trains on {}; no usable GPU: {}", train.device, cpu, auto_reason), ""};
}

CheckResult check_data(const NodeConfig& config) {
    const std::string& dir = config.swarm.train.data.dir;
    try {
        const std::vector<std::string> train = list_shards(dir, "train");
        const std::vector<std::string> val = list_shards(dir, "val");
        return {CheckLevel::Ok, "data",
                fmt::format("{}: {} train shard(s) of {} tokens, {} val shard(s) of {} tokens", dir,
                            train.size(), count_tokens(train), val.size(), count_tokens(val)),
                ""};
    } catch (const Error& e) {
        return {
            CheckLevel::Fail, "data", e.what(),
            fmt::format(
                "starling data prepare --out {} (or set [data].dir, STARLING_DATA_DIR, to prepared "
                "shards)",
                dir)};
    }
}

CheckResult check_tokenizer(const NodeConfig& config) {
    const DataConfig& data = config.swarm.train.data;
    try {
        const std::unique_ptr<Tokenizer> tokenizer = load_tokenizer(data.tokenizer);
        check_shards_tokenizer(data.dir, data.tokenizer);
        return {CheckLevel::Ok, "tokenizer",
                fmt::format("{}, model vocabulary {}", tokenizer->describe(),
                            config.swarm.train.model.vocab_size),
                ""};
    } catch (const Error& e) {
        return {
            CheckLevel::Fail, "tokenizer", e.what(),
            fmt::format(
                "prepare the shards with the configured tokenizer: starling data prepare{} --out {}",
                data.tokenizer.empty() ? "" : " --tokenizer " + data.tokenizer, data.dir)};
    }
}

CheckResult check_data_dir(const NodeConfig& config) {
    const fs::path& dir = config.data_dir;
    const std::string move_it =
        "set [node].data_dir (or --data-dir) to a directory this user can write";
    fs::path base;
    try {
        base = existing_ancestor(dir);
    } catch (const Error& e) {
        return {CheckLevel::Fail, "data_dir", e.what(), move_it};
    }
    std::error_code error;
    if (!fs::is_directory(base, error))
        return {CheckLevel::Fail, "data_dir", fmt::format("{} is not a directory", base.string()),
                move_it};
    if (const std::string problem = write_problem(base); !problem.empty())
        return {CheckLevel::Fail, "data_dir",
                fmt::format("cannot write in {}: {}", base.string(), problem), move_it};

    // What the daemon keeps: keep_checkpoints snapshots (daemon/swarm/swarm_snapshot.h: 32 + 16 n
    // bytes) and one more being written before the oldest is pruned.
    const uint64_t parameters = static_cast<uint64_t>(config.swarm.train.model.num_parameters());
    const uint64_t per_checkpoint = 32 + 16 * parameters;
    const uint64_t needed = (static_cast<uint64_t>(config.keep_checkpoints) + 1) * per_checkpoint;
    const fs::space_info space = fs::space(base, error);
    if (error)
        return {CheckLevel::Warn, "data_dir",
                fmt::format("cannot read the free space of {}: {}", base.string(), error.message()),
                "make sure it has room for " + human_bytes(needed)};
    if (const auto holder = data_dir_lock_holder(dir))
        return {CheckLevel::Fail, "data_dir",
                fmt::format("{} is in use by a running starlingd ({} holds its LOCK)", dir.string(),
                            *holder),
                "stop that daemon first, or give this node a data directory of its own"};
    const std::string where = fs::exists(dir, error)
                                  ? dir.string()
                                  : dir.string() + " (created under " + base.string() + ")";
    const std::string detail =
        fmt::format("{}: writable, {} free, checkpoints need {} ({} + 1 in flight of {})", where,
                    human_bytes(space.available), human_bytes(needed), config.keep_checkpoints,
                    human_bytes(per_checkpoint));
    if (space.available < needed)
        return {CheckLevel::Warn, "data_dir", detail,
                "free space there, lower [swarm].keep_checkpoints or move [node].data_dir"};
    return {CheckLevel::Ok, "data_dir", detail, ""};
}

CheckResult check_credentials(const NodeConfig& config) {
    const PeerConfig& peer = config.swarm.peer;
    if (peer.tls.enabled()) {
        try {
            check_tls_files(peer.tls);  // readable, the key the certificate's, the CA its signer
            return {CheckLevel::Ok, "secret/TLS",
                    fmt::format("mutual TLS (CA {}, certificate {}){}", peer.tls.ca.string(),
                                peer.tls.cert.string(),
                                peer.swarm_secret.empty() ? "" : " and a swarm secret (not shown)"),
                    ""};
        } catch (const Error& e) {
            return {
                CheckLevel::Fail, "secret/TLS", e.what(),
                "set [peer].tls_ca, tls_cert and tls_key to readable PEM files: a CA bundle, a certificate it "
                "signed and that certificate's key"};
        }
    }
    // Anyone who guesses the secret can join the swarm and feed it weights.
    constexpr size_t kShortSecret = 16;
    const std::string detail =
        "a swarm secret (not shown), no TLS: peers are authenticated, traffic is not encrypted";
    if (peer.swarm_secret.size() < kShortSecret)
        return {CheckLevel::Warn, "secret/TLS",
                fmt::format("{}; the secret is shorter than {} characters", detail, kShortSecret),
                "use a long random secret on every node, e.g. from `openssl rand -hex 32`"};
    return {CheckLevel::Ok, "secret/TLS", detail, ""};
}

int run_check(const CheckOptions& options) {
    NodeConfig config;
    try {
        config = load_node_config(options.config_path);
        apply_node_flags(options.flags, config);
    } catch (const std::exception& e) {  // starling::Error naming the file and key, or a TOML error
        std::fputs(
            format_check({CheckLevel::Fail, "config", e.what(),
                          "correct that key in the file (or its STARLING_<SECTION>_<KEY> variable, "
                          "or the flag that sets it)"})
                .c_str(),
            stdout);
        return 1;
    }
    int failed = 0;
    int warned = 0;
    const auto report = [&](const CheckResult& result) {
        failed += result.level == CheckLevel::Fail;
        warned += result.level == CheckLevel::Warn;
        std::fputs(format_check(result).c_str(), stdout);
        std::fflush(stdout);  // the seeds may take seconds: show what is known already
    };
    report({CheckLevel::Ok, "config",
            fmt::format("{}: {} parameters, method {}, swarm \"{}\"", options.config_path,
                        config.swarm.train.model.num_parameters(),
                        outer_method_name(config.swarm.method), config.swarm.peer.swarm_id),
            ""});
    if (const std::vector<std::string> unknown = unknown_starling_variables(); !unknown.empty()) {
        std::string names;
        for (const std::string& name : unknown) names += (names.empty() ? "" : ", ") + name;
        report(
            {CheckLevel::Warn, "environment", names + ": not Starling settings, ignored",
             "fix the spelling: a setting's variable is STARLING_<SECTION>_<KEY>, e.g. STARLING_TRAIN_STEPS"});
    }
    report(check_device(config));
    report(check_data(config));
    report(check_tokenizer(config));
    report(check_data_dir(config));
    for (const CheckResult& port : check_ports(config)) report(port);
    report(check_announce(config));
    report(check_seeds(config));
    report(check_reachable(config));
    report(check_credentials(config));
    if (failed > 0) {
        std::printf("%d check(s) failed: starlingd would not start or not work with this config\n",
                    failed);
        return 1;
    }
    std::printf("ready to start starlingd%s\n",
                warned > 0 ? fmt::format(" ({} warning(s))", warned).c_str() : "");
    return 0;
}

}  // namespace starling::cli
