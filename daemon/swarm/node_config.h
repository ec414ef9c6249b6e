// starlingd's configuration: the engine's sections of a config file (engine/config.h: [model],
// [train], [optimizer], [data], [eval]) plus the daemon's own: [node], [swarm], [outer],
// [exchange], [peer], [control], [metrics]. configs/pico.toml, nano.toml and 124m.toml hold all
// of them. Every key can be overridden by STARLING_<SECTION>_<KEY>, and starlingd's flags
// override a few on top (apply_node_flags). `starling train` reads the same files and ignores the
// daemon's sections; starlingd ignores [log] and [checkpoint], which are `starling train`'s.
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "daemon/swarm/swarm_node.h"
#include "engine/config_keys.h"

namespace starling {

// What a config is loaded for: running a node needs the swarm's credentials; reading its
// checkpoints (starling export and sample) does not.
enum class NodeConfigUse { RunNode, ReadCheckpoints };

struct NodeConfig {
    std::filesystem::path config_path;  // the file it was read from, re-read on SIGHUP
    // The engine, H, the outer step, the codec and the peer layer. swarm.peer.data_dir is
    // data_dir: the node's key and peer cache live there.
    SwarmConfig swarm;
    std::filesystem::path data_dir = "out/node";  // node.key, peers.txt, checkpoints/
    std::string secret_file;  // [peer].secret_file: read into swarm.peer.swarm_secret at load
    std::string log_level = "info";
    std::string log_format =
        "text";                 // or "json": one object per line (daemon/service/log_format.h)
    int training_nice = 0;      // the round loop's thread this much nicer than the daemon
    int checkpoint_every = 10;  // rounds; 0: only when draining
    int keep_checkpoints = 3;
    double join_timeout_s =
        30.0;  // first start with seeds and no checkpoint: wait this long for a donor
    double pace_timeout_s =
        60.0;             // a node ahead of every compatible member waits at most this per round
    int eval_every = 10;  // rounds between validation losses of phi; 0: never
    std::string control_listen = "127.0.0.1:7701";  // or unix:/path
    bool control_allow_remote = false;  // a non-local control address is refused unless this is set
    std::string metrics_listen = "127.0.0.1:9464";  // "" turns /metrics off

    std::filesystem::path checkpoint_dir() const { return data_dir / "checkpoints"; }
    void validate(
        NodeConfigUse use = NodeConfigUse::RunNode) const;  // throws starling::Error naming the key
};

// Reads and validates a config file (environment overrides applied); errors name the file and key.
NodeConfig load_node_config(const std::filesystem::path& path,
                            NodeConfigUse use = NodeConfigUse::RunNode);
// Every key such a file holds, with its default, range and help (engine/config_keys.h), and the
// same with the values of `config` in place of the defaults.
std::vector<KeyDescription> node_config_keys();
std::vector<KeyDescription> node_config_keys(NodeConfig config);

// What starlingd's flags may set; each one given replaces the config's value.
struct NodeFlags {
    std::optional<std::string> data_dir, listen, announce, control, metrics, log_level, log_format;
    std::vector<std::string> seeds;  // added to the config's
};
void apply_node_flags(const NodeFlags& flags, NodeConfig& config);

// Whether a listen address for the Control service is local: a unix socket, 127.0.0.0/8, ::1 or
// localhost. Anything else must be asked for with [control].allow_remote.
bool is_local_listen_address(const std::string& address);

}  // namespace starling
