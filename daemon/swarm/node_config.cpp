#include "daemon/swarm/node_config.h"

#include <fstream>
#include <sstream>

#include "common/error.h"
#include "engine/config_reader.h"
#include "peer/address.h"

namespace starling {

namespace {

void need(bool ok, const std::string& problem) {
    if (!ok) throw Error("config: " + problem);
}

void read_milliseconds(TableReader& reader, const char* key, std::chrono::milliseconds& out) {
    int64_t ms = out.count();
    reader.read(key, ms);
    out = std::chrono::milliseconds(ms);
}

std::string read_secret_file(const std::filesystem::path& path) {
    std::ifstream in(path);
    if (!in) throw Error("config: [peer].secret_file " + path.string() + " cannot be read");
    std::stringstream text;
    text << in.rdbuf();
    std::string secret = text.str();
    while (!secret.empty() &&
           (secret.back() == '\n' || secret.back() == '\r' || secret.back() == ' '))
        secret.pop_back();
    if (secret.empty()) throw Error("config: [peer].secret_file " + path.string() + " is empty");
    return secret;
}

void read_peer_section(TableReader& p, PeerConfig& peer) {
    p.read("listen", peer.listen);
    p.read("announce", peer.announce);
    p.read("seeds", peer.seeds);
    p.read("swarm_id", peer.swarm_id);
    p.read("secret", peer.swarm_secret);
    std::string secret_file;
    p.read("secret_file", secret_file);
    if (!secret_file.empty()) {
        need(peer.swarm_secret.empty(),
             "[peer].secret and [peer].secret_file are both set; keep one");
        peer.swarm_secret = read_secret_file(secret_file);
    }
    std::string ca, cert, key;
    p.read("tls_ca", ca);
    p.read("tls_cert", cert);
    p.read("tls_key", key);
    peer.tls = {ca, cert, key};
    read_milliseconds(p, "gossip_interval_ms", peer.gossip_interval);
    read_milliseconds(p, "probe_timeout_ms", peer.probe_timeout);
    read_milliseconds(p, "suspicion_timeout_ms", peer.membership.suspicion_timeout);
    read_milliseconds(p, "pair_timeout_ms", peer.pair_timeout);
    read_milliseconds(p, "exchange_timeout_ms", peer.exchange_timeout);
    read_milliseconds(p, "exchange_timeout_max_ms", peer.exchange_timeout_max);
    double min_link_mbit = peer.min_link_bytes_per_s * 8 / 1e6;
    p.read("min_link_mbit", min_link_mbit);
    peer.min_link_bytes_per_s = min_link_mbit * 1e6 / 8;
    read_milliseconds(p, "state_sync_timeout_ms", peer.state_sync_timeout);
    read_milliseconds(p, "state_sync_timeout_max_ms", peer.state_sync_timeout_max);
    double state_sync_min_link_mbit = peer.state_sync_min_link_bytes_per_s * 8 / 1e6;
    p.read("state_sync_min_link_mbit", state_sync_min_link_mbit);
    peer.state_sync_min_link_bytes_per_s = state_sync_min_link_mbit * 1e6 / 8;
    p.read("max_round_gap", peer.max_round_gap);
    p.reject_unknown();
}

}  // namespace

bool is_local_listen_address(const std::string& address) {
    if (address.rfind("unix:", 0) == 0) return true;
    const auto parsed = parse_host_port(address);
    return parsed && is_loopback_host(parsed->host);
}

void NodeConfig::validate(NodeConfigUse use) const {
    swarm.validate();
    const PeerConfig& p = swarm.peer;
    need(!data_dir.empty(), "[node].data_dir must not be empty");
    need(checkpoint_every >= 0, "[swarm].checkpoint_every must not be negative");
    need(keep_checkpoints >= 1, "[swarm].keep_checkpoints must be at least 1");
    need(join_timeout_s >= 0.0, "[swarm].join_timeout_s must not be negative");
    need(pace_timeout_s >= 0.0, "[swarm].pace_timeout_s must not be negative");
    need(eval_every >= 0, "[swarm].eval_every must not be negative");
    need(!p.listen.empty(), "[peer].listen must not be empty");
    need(!p.swarm_id.empty(), "[peer].swarm_id must not be empty");
    need(
        use == NodeConfigUse::ReadCheckpoints || !p.swarm_secret.empty() || p.tls.enabled(),
        "[peer].secret (or secret_file, or STARLING_PEER_SECRET) must be set unless TLS is configured: every "
        "node of a swarm proves membership with it");
    need(p.gossip_interval.count() >= 10, "[peer].gossip_interval_ms must be at least 10");
    need(p.probe_timeout.count() >= 10, "[peer].probe_timeout_ms must be at least 10");
    need(p.membership.suspicion_timeout.count() >= 10,
         "[peer].suspicion_timeout_ms must be at least 10");
    need(p.pair_timeout.count() >= 10, "[peer].pair_timeout_ms must be at least 10");
    need(p.exchange_timeout.count() >= 10, "[peer].exchange_timeout_ms must be at least 10");
    need(p.exchange_timeout_max >= p.exchange_timeout,
         "[peer].exchange_timeout_max_ms must be at least exchange_timeout_ms");
    need(p.min_link_bytes_per_s > 0, "[peer].min_link_mbit must be above 0");
    need(p.state_sync_timeout.count() >= 10, "[peer].state_sync_timeout_ms must be at least 10");
    need(p.state_sync_timeout_max >= p.state_sync_timeout,
         "[peer].state_sync_timeout_max_ms must be at least state_sync_timeout_ms");
    need(p.state_sync_min_link_bytes_per_s > 0, "[peer].state_sync_min_link_mbit must be above 0");
    need(!control_listen.empty(), "[control].listen must not be empty");
    need(control_allow_remote || is_local_listen_address(control_listen),
         "[control].listen \"" + control_listen +
             "\" is not a local address; the Control API can make the node leave, so set "
             "[control].allow_remote = true to expose it on purpose");
    const std::vector<std::string> levels{"trace", "debug",    "info", "warn",
                                          "error", "critical", "off"};
    need(std::find(levels.begin(), levels.end(), log_level) != levels.end(),
         "[node].log_level \"" + log_level +
             "\" is not one of trace, debug, info, warn, error, critical, off");
    need(log_format == "text" || log_format == "json",
         "[node].log_format \"" + log_format + "\" is not text or json");
}

NodeConfig load_node_config(const std::filesystem::path& path, NodeConfigUse use) {
    const std::string file = path.string();
    const toml::table root = parse_config_file(file);
    check_config_sections(file, root,
                          {"model", "train", "optimizer", "data", "log", "eval", "checkpoint",
                           "node", "swarm", "outer", "exchange", "peer", "control", "metrics"});
    auto section = [&](const char* name) { return config_section(file, root, name); };

    NodeConfig c;
    c.config_path = path;
    // The recommended codec for the state messages, from the swarm study (docs/results/README.md).
    c.swarm.exchange.state_codec = codec::Codec::Q8;
    // Operators' defaults for a real network; local_cluster_config() is the tests' fast one.
    c.swarm.peer.listen = "0.0.0.0:7700";
    TrainConfig& t = c.swarm.train;
    try {
        // [data]'s node_id and partitions are `starling train`'s: a swarm node's data order follows
        // its node id.
        read_engine_sections(file, root, t);
        TableReader e = section("eval");
        int steps_between_evals = 0;  // [eval].every is `starling train`'s, in steps
        e.read("every", steps_between_evals);
        e.read("batches", t.eval_batches);
        e.reject_unknown();

        TableReader n = section("node");
        std::string data_dir = c.data_dir.string();
        n.read("data_dir", data_dir);
        c.data_dir = data_dir;
        n.read("log_level", c.log_level);
        n.read("log_format", c.log_format);
        n.reject_unknown();

        TableReader s = section("swarm");
        read_named(s, "method", c.swarm.method, outer_method_name, outer_method_from_name);
        s.read("inner_steps", c.swarm.inner_steps);
        s.read("checkpoint_every", c.checkpoint_every);
        s.read("keep_checkpoints", c.keep_checkpoints);
        s.read("join_timeout_s", c.join_timeout_s);
        s.read("pace_timeout_s", c.pace_timeout_s);
        s.read("eval_every", c.eval_every);
        s.reject_unknown();

        TableReader u = section("outer");
        read_outer_section(u, c.swarm.outer);
        TableReader g = section("exchange");
        read_exchange_section(g, c.swarm.exchange);
        TableReader p = section("peer");
        read_peer_section(p, c.swarm.peer);

        TableReader k = section("control");
        k.read("listen", c.control_listen);
        k.read("allow_remote", c.control_allow_remote);
        k.reject_unknown();
        TableReader x = section("metrics");
        x.read("listen", c.metrics_listen);
        x.reject_unknown();

        c.swarm.peer.data_dir = c.data_dir;
        c.validate(use);
    } catch (const Error& err) {
        const std::string what = err.what();
        throw Error(what.rfind(file, 0) == 0 ? what : file + ": " + what);
    }
    return c;
}

void apply_node_flags(const NodeFlags& flags, NodeConfig& c) {
    if (flags.data_dir) c.data_dir = *flags.data_dir;
    if (flags.listen) c.swarm.peer.listen = *flags.listen;
    if (flags.announce) c.swarm.peer.announce = *flags.announce;
    if (flags.control) c.control_listen = *flags.control;
    if (flags.metrics) c.metrics_listen = *flags.metrics;
    if (flags.log_level) c.log_level = *flags.log_level;
    if (flags.log_format) c.log_format = *flags.log_format;
    c.swarm.peer.seeds.insert(c.swarm.peer.seeds.end(), flags.seeds.begin(), flags.seeds.end());
    c.swarm.peer.data_dir = c.data_dir;
    c.validate();
}

}  // namespace starling
