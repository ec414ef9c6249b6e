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

template <class V>
void visit_peer_keys(V& v, NodeConfig& c) {
    PeerConfig& p = c.swarm.peer;
    v.section("peer");
    v("listen", p.listen, "HOST:PORT the peer port binds", non_empty());
    v("announce", p.announce, "HOST:PORT peers dial; \"\": the listen host and bound port");
    v("seeds", p.seeds, "HOST:PORT of members to join through");
    v("swarm_id", p.swarm_id, "nodes pair only within one swarm id", non_empty());
    v("secret", p.swarm_secret, "the swarm's shared secret (required unless TLS)");
    v("secret_file", c.secret_file, "a file holding the secret instead");
    v("tls_ca", p.tls.ca, "PEM: the swarm's certificate authority (mutual TLS)");
    v("tls_cert", p.tls.cert, "PEM: this node's certificate, signed by the CA");
    v("tls_key", p.tls.key, "PEM: its private key");
    v("gossip_interval_ms", Milliseconds{p.gossip_interval}, "gossip and probe period",
      at_least(10));
    v("probe_timeout_ms", Milliseconds{p.probe_timeout}, "a probe's answer", at_least(10));
    v("suspicion_timeout_ms", Milliseconds{p.membership.suspicion_timeout},
      "suspected until declared dead, in swarms of up to 10; larger ones wait this times log10 "
      "of their size",
      at_least(10));
    v("pair_timeout_ms", Milliseconds{p.pair_timeout}, "T_pair: choosing a round's partner",
      at_least(10));
    v("exchange_timeout_ms", Milliseconds{p.exchange_timeout},
      "T_xchg: the exchange budget's floor", at_least(10));
    v("exchange_timeout_max_ms", Milliseconds{p.exchange_timeout_max},
      "the exchange budget's ceiling, at least exchange_timeout_ms", at_least(10));
    v("min_link_mbit", MegabitsPerSecond{p.min_link_bytes_per_s},
      "the rate assumed before an exchange with a partner measured one", above(0));
    v("state_sync_timeout_ms", Milliseconds{p.state_sync_timeout},
      "a state copy's chunk call at least", at_least(10));
    v("state_sync_timeout_max_ms", Milliseconds{p.state_sync_timeout_max},
      "a state copy's chunk call at most, at least state_sync_timeout_ms", at_least(10));
    v("state_sync_min_link_mbit", MegabitsPerSecond{p.state_sync_min_link_bytes_per_s},
      "the rate assumed before a donor's first chunk", above(0));
    v("max_round_gap", p.max_round_gap, "S_max: partners' rounds differ by at most this");
    v("relay_limit_mib", p.relay_limit_mib,
      "as an anchor, the MiB of its private members' DiLoCo messages held at once for others to "
      "fetch, each member an even share; 0: none");
    v("relay_mbit", MegabitsPerSecond{p.relay_bytes_per_s},
      "as an anchor, the rate at which it passes exchanges between two private members, all of "
      "them together, each direction an even share; 0: it relays none",
      at_least(0));
    v("hole_punch", p.hole_punch,
      "two members that cannot be dialed try to connect to each other directly (a TCP hole punch "
      "through their NATs) before exchanging through a relay");
    v("punch_timeout_ms", Milliseconds{p.punch_timeout},
      "a hole punch's tries at most, from the pairing's agreement", at_least(10));
    v("max_unauthenticated_connections", p.connections.max_unauthenticated,
      "connections with no authenticated call yet, held at once; more are closed", at_least(1));
    v("max_unauthenticated_per_source", p.connections.max_unauthenticated_per_source,
      "the same, from one IP address", at_least(1));
}

template <class V>
void visit_node_config(V& v, NodeConfig& c) {
    TrainConfig& t = c.swarm.train;
    visit_model_keys(v, t.model);
    visit_train_keys(v, t);
    visit_optimizer_keys(v, t);
    visit_data_keys(v, t.data);
    v.section("eval");
    v.accepted("every", "starling train's, in steps; starlingd uses [swarm] eval_every");
    visit_eval_batches_key(v, t);
    v.section("node");
    v("data_dir", c.data_dir, "node.key, peers.txt, checkpoints/ and LOCK", non_empty());
    v("log_level", c.log_level, "trace, debug, info, warn, error, critical or off");
    v("log_format", c.log_format, "text, or json: one object per line");
    v("training_nice", c.training_nice,
      "> 0: the round loop (inner steps, coding, the held-out check) and the threads it starts run "
      "this much nicer than the rest of the daemon, so that on a box with more work than cores the "
      "peer protocol's probes, gossip and answers are scheduled ahead of training and members do "
      "not suspect this node; 0: as the daemon runs",
      in_range(0, 19));
    v.section("swarm");
    visit_round_keys(v, c.swarm);
    v("overlap", c.swarm.overlap,
      "run round r's exchange beside round r+1's inner steps (docs/overlap.md); method local has "
      "no exchange and ignores it");
    v("round_seconds", c.swarm.round_seconds,
      "> 0: each inner phase takes the steps that fit this many seconds, and the outer step weighs "
      "members by tokens (docs/uneven.md); 0: automatic, inner_steps while the members' step "
      "times are within uneven_margin, else H times their median",
      at_least(0.0));
    v("uneven_margin", c.swarm.uneven_margin,
      "automatic rounds (round_seconds = 0) take a time budget once the slowest member's step "
      "time exceeds the fastest's by more than this fraction; inf: always inner_steps",
      at_least(0.0));
    v("checkpoint_every", c.checkpoint_every, "rounds between checkpoints; 0: only when draining",
      at_least(0));
    v("keep_checkpoints", c.keep_checkpoints, "newest checkpoints kept", at_least(1));
    v("join_timeout_s", c.join_timeout_s,
      "first start with seeds and no checkpoint: how long to wait for a donor", at_least(0));
    v("pace_timeout_s", c.pace_timeout_s,
      "a node ahead of every compatible member waits at most this per round", at_least(0));
    v("eval_every", c.eval_every, "rounds between validation losses of phi; 0: never", at_least(0));
    visit_outer_keys(v, c.swarm.outer);
    visit_exchange_keys(v, c.swarm.exchange);
    visit_peer_keys(v, c);
    v.section("control");
    v("listen", c.control_listen, "HOST:PORT or unix:PATH of the Control API", non_empty());
    v("allow_remote", c.control_allow_remote, "serve the Control API on a non-local address");
    v.section("metrics");
    v("listen", c.metrics_listen, "HOST:PORT of /metrics; \"\": off");
}

// Operators' defaults for a real network; local_cluster_config() is the tests' fast one.
NodeConfig node_defaults() {
    NodeConfig c;
    // The exchange beside the next inner phase: 0.9% of loss at any delay in the study, against
    // idle accelerators for the whole exchange otherwise (docs/overlap.md).
    c.swarm.overlap = true;
    // The recommended codec for the state messages, from the swarm study (docs/results/README.md).
    c.swarm.exchange.state_codec = codec::Codec::Q8;
    // Rounds that follow the members' speeds once they differ by a quarter (docs/uneven.md).
    c.swarm.uneven_margin = 0.25;
    c.swarm.peer.listen = "0.0.0.0:7700";
    return c;
}

}  // namespace

bool is_local_listen_address(const std::string& address) {
    if (address.rfind("unix:", 0) == 0) return true;
    const auto parsed = parse_host_port(address);
    return parsed && is_loopback_host(parsed->host);
}

void NodeConfig::validate(NodeConfigUse use) const {
    NodeConfig keys = *this;  // the visit takes the fields by reference
    KeyRangeChecker check;
    visit_node_config(check, keys);
    swarm.validate();
    const PeerConfig& p = swarm.peer;
    need(
        use == NodeConfigUse::ReadCheckpoints || !p.swarm_secret.empty() || p.tls.enabled(),
        "[peer].secret (or secret_file, or STARLING_PEER_SECRET) must be set unless TLS is configured: every "
        "node of a swarm proves membership with it");
    need(p.exchange_timeout_max >= p.exchange_timeout,
         "[peer].exchange_timeout_max_ms must be at least exchange_timeout_ms");
    need(p.state_sync_timeout_max >= p.state_sync_timeout,
         "[peer].state_sync_timeout_max_ms must be at least state_sync_timeout_ms");
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
    NodeConfig c = node_defaults();
    c.config_path = path;
    try {
        // [log] and [checkpoint] are `starling train`'s.
        ConfigFileReader reader(file, {"log", "checkpoint"});
        visit_node_config(reader, c);
        reader.finish();
        if (!c.secret_file.empty()) {
            need(c.swarm.peer.swarm_secret.empty(),
                 "[peer].secret and [peer].secret_file are both set; keep one");
            c.swarm.peer.swarm_secret = read_secret_file(c.secret_file);
        }
        c.swarm.peer.data_dir = c.data_dir;
        c.validate(use);
    } catch (const Error& err) {
        const std::string what = err.what();
        throw Error(what.rfind(file, 0) == 0 ? what : file + ": " + what);
    }
    return c;
}

std::vector<KeyDescription> node_config_keys() { return node_config_keys(node_defaults()); }

std::vector<KeyDescription> node_config_keys(NodeConfig config) {
    KeyDescriber describe;
    visit_node_config(describe, config);
    return describe.keys;
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
