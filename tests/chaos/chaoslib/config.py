"""The chaos run's node config: configs/pico.toml with a few keys replaced, written to the work dir.

The file is edited line by line (a replaced key keeps its place in its section, a key the file lacks
is added at the end of its section) and read back with tomllib, so what the script believes the
daemons run with is what the file says.
"""

import json
import re
import tomllib

SECTION = re.compile(r"^\s*\[([A-Za-z0-9_.]+)\]\s*(#.*)?$")
KEY = re.compile(r"^\s*([A-Za-z0-9_]+)\s*=")


def toml_value(value):
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # a TOML basic string for everything a path or address holds
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    raise TypeError(f"no TOML form for {value!r}")


def derive(text, overrides):
    """text with overrides {section: {key: value}} applied."""
    out = []
    seen = set()
    section = None

    def add_missing(sec):
        for key, value in overrides.get(sec, {}).items():
            if (sec, key) not in seen:
                out.append(f"{key} = {toml_value(value)}  # chaos")
                seen.add((sec, key))

    for line in text.splitlines():
        m = SECTION.match(line)
        if m:
            add_missing(section)
            section = m.group(1)
            out.append(line)
            continue
        m = KEY.match(line)
        if m and m.group(1) in overrides.get(section, {}):
            key = m.group(1)
            out.append(f"{key} = {toml_value(overrides[section][key])}  # chaos")
            seen.add((section, key))
            continue
        out.append(line)
    add_missing(section)
    for sec, keys in overrides.items():
        if any((sec, k) not in seen for k in keys):
            out.extend(["", f"[{sec}]"])
            add_missing(sec)
    return "\n".join(out) + "\n"


# What a chaos node runs: pico on one thread, a schedule far longer than any run, checkpoints
# every 5 rounds (so kill -9 restarts have something recent to resume), no metrics endpoint.
# Timeouts stay pico.toml's (pair 5 s, exchange 10 s): the stall bound is computed from them.
def chaos_overrides(data_dir, steps):
    return {
        "train": {"steps": steps, "threads": 1, "device": "cpu"},
        "data": {"dir": str(data_dir)},
        "swarm": {"method": "noloco", "checkpoint_every": 5, "keep_checkpoints": 3, "eval_every": 10},
        "peer": {"seeds": [], "secret": "", "swarm_id": "chaos"},
        "metrics": {"listen": ""},
    }


def parse_setting(text):
    """SECTION.KEY=VALUE (a --set) as (section, key, value): VALUE read as a TOML value, or as a
    string where it is not one (TOPK, split). ValueError naming the problem when malformed."""
    name, sep, raw = text.partition("=")
    section, dot, key = name.strip().rpartition(".")
    if not sep or not dot or not section or not KEY.match(key + " =") or not raw.strip():
        raise ValueError(f"--set {text!r}: expected SECTION.KEY=VALUE, e.g. exchange.delta_codec=TOPK")
    try:
        value = tomllib.loads(f"v = {raw.strip()}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw.strip()
    return section, key, value


def write_configs(pico_path, work, data_dir, steps, settings=()):
    """Writes work/chaos.toml (the swarm's) and work/single.toml (the same, method local: the
    calibration run and the single-node comparison), `settings` ((section, key, value) of --set)
    over the chaos defaults in both. Returns (paths, parsed chaos config)."""
    text = pico_path.read_text()
    overrides = chaos_overrides(data_dir, steps)
    for section, key, value in settings:
        overrides.setdefault(section, {})[key] = value
    chaos = derive(text, overrides)
    overrides["swarm"]["method"] = "local"
    single = derive(text, overrides)
    chaos_path = work / "chaos.toml"
    single_path = work / "single.toml"
    chaos_path.write_text(chaos)
    single_path.write_text(single)
    return chaos_path, single_path, tomllib.loads(chaos)


class Settings:
    """The figures of a parsed config the checks need (pico.toml's defaults where a key is absent,
    as the daemon's own defaults in daemon/swarm/node_config.h and peer/peer_node.h)."""

    def __init__(self, cfg):
        peer = cfg.get("peer", {})
        swarm = cfg.get("swarm", {})
        train = cfg.get("train", {})
        model = cfg.get("model", {})
        self.method = swarm.get("method", "noloco")
        self.pair_timeout_s = peer.get("pair_timeout_ms", 5000) / 1000.0
        self.exchange_timeout_s = peer.get("exchange_timeout_ms", 10000) / 1000.0
        self.max_round_gap = peer.get("max_round_gap", 1)
        self.inner_steps = swarm.get("inner_steps", 20)
        self.eval_every = swarm.get("eval_every", 10)
        self.checkpoint_every = swarm.get("checkpoint_every", 10)
        self.join_timeout_s = swarm.get("join_timeout_s", 30.0)
        self.pace_timeout_s = swarm.get("pace_timeout_s", 60.0)
        self.steps = train.get("steps", 1000)
        self.tokens_per_step = train.get("batch_size", 16) * (train.get("seq_len", 0) or model.get("context", 64))
