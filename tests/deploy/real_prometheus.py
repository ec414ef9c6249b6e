#!/usr/bin/python3
"""The monitoring in a real Prometheus against a real swarm: Debian's prometheus binary (2.42,
which scripts/setup installs) scrapes three pico starlingd on 127.0.0.1 every second with
deploy/prometheus/starling-rules.yml loaded, and its HTTP API must show

  - every target up;
  - data for every query of deploy/grafana/starling-dashboard.json (Grafana's variables filled in
    as check_monitoring.py fills them), and the right figures on a young swarm: the CPU panel
    against the CPU time the kernel counts for each process, the time left against
    `starling status`;
  - no alert pending or firing while the swarm is healthy;
  - StarlingNodeDown firing for a node killed with SIGKILL, and for no other.

Its own Prometheus listens on a free port with a temporary storage directory, so a system
Prometheus on :9090 is left alone. Every wait is for a state, with a deadline generous enough for
a loaded 2-core machine; nothing assumes a pace. About 1.5 minutes.

usage: real_prometheus.py [--build DIR]   (DIR holds bin/starlingd and bin/starling; default build)
exit status: 0 every check held; 1 a check failed (named, with the logs' last lines); 2 setup
"""
import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

import yaml

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "support"))
from check_monitoring import GRAFANA_INTERVALS, dashboard_exprs, grafana_substitute  # noqa: E402
from ports import PortPicker  # noqa: E402

SOURCE = Path(__file__).resolve().parent.parent.parent
PROMETHEUS = "/usr/bin/prometheus"
NODES = 3
# The window the dashboard's rates get (check_monitoring.GRAFANA_INTERVALS), in seconds.
RATE_WINDOW_S = float(GRAFANA_INTERVALS["__rate_interval"].rstrip("s"))
# What the daemons get on top of configs/pico.toml: the integration tests' settings
# (tests/integration/daemon_harness.cpp), which hold on a busy machine; a checkpoint every 2 rounds
# and an evaluation every 10 (seconds: every panel has data soon, and Prometheus scrapes a node
# before its first evaluation); a schedule that does not end. The learning rate is a tenth of
# pico's, so the loss still falls through the check: at pico's own, batch-8 replicas reach their
# plateau within half a minute, and from there their evaluations scatter by more than the 5% that
# StarlingValLossRising calls a rise (its pending state is then right, not a false alarm). 64
# evaluation batches make each evaluation steadier still.
DAEMON_ENV = {
    "STARLING_PEER_SECRET": "real prometheus check",
    "STARLING_PEER_SWARM_ID": "real-prometheus",
    "STARLING_TRAIN_THREADS": "1",
    "STARLING_TRAIN_BATCH_SIZE": "8",
    "STARLING_TRAIN_SEQ_LEN": "32",
    "STARLING_TRAIN_STEPS": "100000",
    "STARLING_SWARM_INNER_STEPS": "8",
    "STARLING_SWARM_CHECKPOINT_EVERY": "2",
    "STARLING_SWARM_EVAL_EVERY": "10",
    "STARLING_OPTIMIZER_LR": "3e-4",
    "STARLING_EVAL_BATCHES": "64",
    "STARLING_SWARM_JOIN_TIMEOUT_S": "10",
    "STARLING_SWARM_PACE_TIMEOUT_S": "5",
    "STARLING_PEER_GOSSIP_INTERVAL_MS": "100",
    "STARLING_PEER_PROBE_TIMEOUT_MS": "1000",
    "STARLING_PEER_SUSPICION_TIMEOUT_MS": "5000",
    "STARLING_PEER_PAIR_TIMEOUT_MS": "3000",
    "STARLING_PEER_EXCHANGE_TIMEOUT_MS": "3000",
}


class CheckFailed(Exception):
    pass


class SetupFailed(Exception):
    pass


def say(text):
    print(f"real_prometheus: {text}", flush=True)


PORTS = PortPicker()
free_port = PORTS.free_port


def wait_for(what, deadline_s, probe, interval_s=0.5):
    """Calls probe() until it returns something true, which is returned; after deadline_s,
    fails naming `what` and the last thing probe() said (probe may return (False, why))."""
    deadline = time.monotonic() + deadline_s
    why = ""
    while True:
        result = probe()
        if isinstance(result, tuple):
            ok, why = result
        else:
            ok = result
        if ok:
            return result
        if time.monotonic() > deadline:
            raise CheckFailed(f"{what}: not within {deadline_s:.0f} s" + (f"\n{why}" if why else ""))
        time.sleep(interval_s)


def tail(path, lines=15):
    try:
        text = Path(path).read_text(errors="replace").splitlines()
    except OSError:
        return f"--- {path}: unreadable\n"
    return f"--- last lines of {path}:\n" + "\n".join(text[-lines:]) + "\n"


class Node:
    def __init__(self, index, root, bin_dir):
        self.name = f"node{index}"
        self.peer, self.control, self.metrics = free_port(), free_port(), free_port()
        self.data = root / self.name
        self.log = root / f"{self.name}.log"
        self.bin_dir = bin_dir
        self.process = None

    @property
    def target(self):
        return f"127.0.0.1:{self.metrics}"

    def start(self, seed, shards):
        argv = [str(self.bin_dir / "starlingd"), "--config", str(SOURCE / "configs" / "pico.toml"),
                "--data-dir", str(self.data), "--listen", f"127.0.0.1:{self.peer}",
                "--control", f"127.0.0.1:{self.control}", "--metrics", self.target]
        if seed:
            argv += ["--seed", seed]
        env = dict(os.environ, STARLING_DATA_DIR=str(shards), **DAEMON_ENV)
        with open(self.log, "w") as log:
            self.process = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)

    def status(self):
        """`starling status --json`, or None while the node does not answer."""
        result = subprocess.run([str(self.bin_dir / "starling"), "--control", f"127.0.0.1:{self.control}",
                                 "status", "--json"], capture_output=True, text=True, timeout=30)
        return json.loads(result.stdout) if result.returncode == 0 else None

    def cpu_seconds(self):
        """User and system CPU seconds of the process as the kernel counts them (proc(5))."""
        fields = Path(f"/proc/{self.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[14 - 3]) + int(fields[15 - 3])) / os.sysconf("SC_CLK_TCK")

    def stop(self):
        if self.process and self.process.poll() is None:
            self.process.kill()
            self.process.wait()


class Prometheus:
    def __init__(self, root, nodes):
        self.port = free_port()
        self.log = root / "prometheus.log"
        self.process = None
        rules = yaml.safe_load((SOURCE / "deploy" / "prometheus" / "starling-rules.yml").read_text())
        shortened = 0
        for group in rules["groups"]:
            for rule in group["rules"]:
                # The shipped 5 minutes would keep the check waiting that long for nothing: the
                # pending state and the rule's expression are what is under test here, and
                # `for:` itself is Prometheus's; starling-rules.test.yml holds the 5 minutes.
                if rule.get("alert") == "StarlingNodeDown":
                    rule["for"] = "5s"
                    shortened += 1
        if shortened != 1:
            raise CheckFailed("starling-rules.yml has no StarlingNodeDown rule")
        (root / "starling-rules.yml").write_text(yaml.safe_dump(rules, sort_keys=False))
        # The job is called starling, as deploy/prometheus/prometheus.yml calls it and the
        # node-down rules expect; a 1 s scrape timeout, since it may not exceed the interval.
        config = {
            "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
            "rule_files": ["starling-rules.yml"],
            "scrape_configs": [{"job_name": "starling",
                                "static_configs": [{"targets": [n.target for n in nodes]}]}],
        }
        (root / "prometheus.yml").write_text(yaml.safe_dump(config, sort_keys=False))
        self.argv = [PROMETHEUS, f"--config.file={root / 'prometheus.yml'}",
                     f"--storage.tsdb.path={root / 'tsdb'}", f"--web.listen-address=127.0.0.1:{self.port}"]

    def start(self):
        with open(self.log, "w") as log:
            self.process = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT)

    def get(self, path, **params):
        url = f"http://127.0.0.1:{self.port}{path}"
        if params:
            url += "?" + urllib.parse.urlencode(params)
        with urllib.request.urlopen(url, timeout=30) as answer:
            body = json.loads(answer.read())
        if body.get("status") != "success":
            raise CheckFailed(f"Prometheus {path} {params}: {body}")
        return body["data"]

    def ready(self):
        if self.process.poll() is not None:
            raise SetupFailed(f"prometheus exited {self.process.returncode}\n{tail(self.log)}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/-/ready", timeout=5) as answer:
                return answer.status == 200
        except OSError:
            return False

    def query(self, expr, at=None):
        params = {"query": expr}
        if at is not None:
            params["time"] = f"{at:.3f}"
        return self.get("/api/v1/query", **params)["result"]

    def alerts(self):
        return self.get("/api/v1/alerts")["alerts"]

    def stop(self):
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def describe_alerts(alerts):
    return "\n".join(f"  {a['labels'].get('alertname')} {a['state']} {a['labels']} value {a.get('value')}"
                     for a in alerts)


def check_targets_tried(prometheus, nodes):
    def probe():
        targets = prometheus.get("/api/v1/targets")["activeTargets"]
        health = {t["labels"].get("instance"): t["health"] for t in targets}
        ok = sorted(health) == sorted(n.target for n in nodes) and "unknown" not in health.values()
        return ok, f"targets: {health}"
    wait_for("Prometheus scraping every node's port", 60, probe)


def check_targets_up(prometheus, nodes):
    def probe():
        targets = prometheus.get("/api/v1/targets")["activeTargets"]
        health = {t["labels"].get("instance"): (t["health"], t.get("lastError", "")) for t in targets}
        ok = sorted(health) == sorted(n.target for n in nodes) and all(h == "up" for h, _ in health.values())
        return ok, "targets: " + (", ".join(f"{i} {h} {e}".strip() for i, (h, e) in sorted(health.items())) or "none")
    wait_for("every node's target up in Prometheus", 90, probe)


def check_swarm_trains(nodes):
    def probe():
        seen = {}
        for n in nodes:
            s = n.status()
            seen[n.name] = int(s.get("rounds_paired", 0)) if s else None
        ok = all(v is not None and v >= 3 for v in seen.values())
        return ok, f"paired rounds: {seen}"
    wait_for("every node paired 3 rounds", 150, probe)


def check_dashboard_has_data(prometheus):
    dashboard = json.loads((SOURCE / "deploy" / "grafana" / "starling-dashboard.json").read_text())
    queries = [(title, grafana_substitute(expr)) for title, expr in dashboard_exprs(dashboard)]

    def probe():
        empty = [(title, expr) for title, expr in queries if not prometheus.query(expr)]
        return not empty, "panels without data:\n" + "\n".join(f"  {t!r}: {e}" for t, e in empty)
    wait_for(f"data for all {len(queries)} dashboard queries", 90, probe, interval_s=1)
    return dict((title, expr) for title, expr in queries)


def by_node(result):
    return {r["metric"].get("node"): float(r["value"][1]) for r in result}


def check_young_figures(prometheus, queries, nodes):
    """The panels that rate() over a fixed 5 or 15 minutes got wrong on a swarm younger than
    that (CPU a tenth of the real figure, the time left 30 times too long): each against an
    independent reading of the same thing."""
    ids = {}
    for n in nodes:
        s = wait_for(f"{n.name} answers starling status", 30, n.status)
        ids[n.name] = s["node_id"]
    # CPU: what the kernel counted for each process over the panel's window, against the panel's
    # value at the window's end. Within half either way: scrapes land a second or so off the ends.
    start = {n.name: n.cpu_seconds() for n in nodes}
    t0 = time.time()
    time.sleep(RATE_WINDOW_S)
    end = {n.name: n.cpu_seconds() for n in nodes}
    t1 = time.time()
    panel = by_node(prometheus.query(queries["CPU cores busy"], at=t1))
    problems = []
    for n in nodes:
        real = (end[n.name] - start[n.name]) / (t1 - t0)
        shown = panel.get(ids[n.name])
        say(f"  {n.name}: CPU panel {shown if shown is None else round(shown, 3)} cores, the kernel's count {real:.3f}")
        if shown is None or not (0.5 * real - 0.05 <= shown <= 2 * real + 0.05):
            problems.append(f"CPU panel shows {shown} cores for {n.name}, the kernel counted {real:.3f}")
    # Time left: against the node's own estimate (status' eta_seconds, from its last rounds).
    # Within a factor of 3 either way: the two paces are over different spans of a young swarm.
    panel = by_node(prometheus.query(queries["Time left at the last 15 minutes' pace"]))
    for n in nodes:
        s = n.status() or {}
        if "eta_seconds" not in s:
            problems.append(f"{n.name}: starling status has no eta_seconds to compare with")
            continue
        shown, own = panel.get(ids[n.name]), float(s["eta_seconds"])
        say(f"  {n.name}: time left panel {shown if shown is None else round(shown)} s, its status {own:.0f} s")
        if shown is None or not (own / 3 <= shown <= own * 3):
            problems.append(f"time left panel shows {shown} s for {n.name}, its status says {own:.0f} s")
    if problems:
        raise CheckFailed("dashboard figures wrong on a young swarm:\n  " + "\n  ".join(problems))


def check_quiet(prometheus, seconds):
    """No alert pending or firing for `seconds`, evaluated every second."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        active = [a for a in prometheus.alerts() if a["state"] in ("pending", "firing")]
        if active:
            raise CheckFailed("alerts on a healthy swarm:\n" + describe_alerts(active))
        time.sleep(1)


def check_node_down(prometheus, victim):
    victim.process.send_signal(signal.SIGKILL)
    victim.process.wait()

    def probe():
        alerts = prometheus.alerts()
        down = [a for a in alerts if a["labels"].get("alertname") == "StarlingNodeDown"]
        wrong = [a for a in down if a["labels"].get("instance") != victim.target]
        if wrong:
            raise CheckFailed("StarlingNodeDown for a node that is up:\n" + describe_alerts(wrong))
        ok = any(a["state"] == "firing" for a in down)
        return ok, "alerts now:\n" + (describe_alerts(alerts) or "  none")
    wait_for(f"StarlingNodeDown firing for {victim.name} ({victim.target}) after its SIGKILL", 60, probe)


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--build", default=str(SOURCE / "build"), help="build directory with bin/starlingd")
    args = parser.parse_args(argv)
    bin_dir = Path(args.build).resolve() / "bin"
    for binary in (bin_dir / "starlingd", bin_dir / "starling"):
        if not os.access(binary, os.X_OK):
            say(f"{binary} not found: build first (scripts/build)")
            return 2
    if not os.access(PROMETHEUS, os.X_OK):
        say(f"{PROMETHEUS} not found: install Debian's prometheus package (scripts/setup does)")
        return 2

    root = Path(tempfile.mkdtemp(prefix="starling-real-prometheus-"))
    nodes = [Node(i, root, bin_dir) for i in range(NODES)]
    prometheus = None
    started = time.monotonic()
    steps = []

    def step(name, function, *fargs):
        t = time.monotonic()
        say(name)
        value = function(*fargs)
        steps.append((name, time.monotonic() - t))
        return value

    status = 1
    try:
        shards = root / "kjv"
        prepared = subprocess.run([str(bin_dir / "starling"), "data", "prepare", "--out", str(shards)],
                                  capture_output=True, text=True)
        if prepared.returncode != 0:
            raise SetupFailed(f"starling data prepare failed: {prepared.stdout}{prepared.stderr}")
        prometheus = Prometheus(root, nodes)
        prometheus.start()
        step("Prometheus ready", wait_for, "Prometheus answering /-/ready", 60, prometheus.ready)
        # The daemons start once Prometheus scrapes their ports (and finds nothing yet), so their
        # series begin as a new node's do in production: before the first round and evaluation,
        # when a figure exported as 0 (no value yet) would be taken for a reading.
        step("Prometheus scraping the nodes' ports", check_targets_tried, prometheus, nodes)
        for i, n in enumerate(nodes):
            n.start(None if i == 0 else f"127.0.0.1:{nodes[0].peer}", shards)
        step("every target up", check_targets_up, prometheus, nodes)
        step("the swarm trains in pairs", check_swarm_trains, nodes)
        queries = step("every dashboard query has data", check_dashboard_has_data, prometheus)
        step("CPU and time left right on a young swarm", check_young_figures, prometheus, queries, nodes)
        step("no alert pending or firing for 20 s", check_quiet, prometheus, 20)
        step("StarlingNodeDown fires for a killed node", check_node_down, prometheus, nodes[2])
        status = 0
    except CheckFailed as e:
        say(f"FAILED: {e}")
    except SetupFailed as e:
        say(f"setup failed: {e}")
        status = 2
    except (OSError, subprocess.SubprocessError, ValueError, KeyError) as e:
        say(f"FAILED: {type(e).__name__}: {e}")
    finally:
        for n in nodes:
            n.stop()
        if prometheus:
            prometheus.stop()
        for name, seconds in steps:
            say(f"  {seconds:5.1f} s  {name}")
        say(f"{time.monotonic() - started:.0f} s in all")
        if status == 0:
            shutil.rmtree(root, ignore_errors=True)
        else:
            for path in [prometheus.log if prometheus else None] + [n.log for n in nodes]:
                if path:
                    print(tail(path), end="")
            say(f"logs and data kept in {root}")
    say("all checks held" if status == 0 else "a check failed")
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
