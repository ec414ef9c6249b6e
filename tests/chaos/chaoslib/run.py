"""scripts/chaos: real starlingd processes under seeded churn, a slow link and hostile connections;
prints what held and what did not (tests/chaos/README.md)."""

import argparse
import math
import os
import random
import secrets
import signal
import statistics
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from . import config as cfgmod
from . import daemons, hostile, logs, nat, netlink, probes, report
from .daemons import Instance, Node, now
from ports import PortPicker

REPO = Path(__file__).resolve().parents[3]

ACTIONS = ["kill9", "term", "leave", "join", "stop"]
WEIGHTS = [3, 2, 2, 1.5, 2]


class UsageError(Exception):
    pass


class Interrupted(Exception):
    pass


def parse_args(argv):
    p = argparse.ArgumentParser(
        prog="scripts/chaos",
        description="Chaos suite: N real starlingd on this machine under seeded kill -9, SIGTERM, leave, "
                    "joiners and SIGSTOP, a shaped slow link and a preface flood; checks crashes, round "
                    "stalls, resumes and joins. Exit 0 all checks held, 1 a check failed, 2 bad usage/setup.")
    p.add_argument("--seed", type=int, default=1, help="seeds the action RNG (default 1)")
    p.add_argument("--duration", type=float, help="seconds of chaos (default 1800; --short: 110)")
    p.add_argument("--nodes", type=int, help="starlingd on the root namespace (default 5; --short: 3)")
    p.add_argument("--short", action="store_true",
                   help="the test-suite preset: 3 nodes, 110 s, no single-node comparison (about 2.5 min)")
    p.add_argument("--bin", default=str(REPO / "build" / "bin"), help="directory of starlingd and starling")
    p.add_argument("--data", default=str(REPO / "out" / "kjv"),
                   help="KJV shards (made with `starling data prepare` when missing)")
    p.add_argument("--work", help="fresh work dir for configs, data dirs and logs (default: a new /tmp/starling-chaos-*)")
    p.add_argument("--json", help="also write the figures and verdicts as JSON to this file")
    p.add_argument("--no-netns", action="store_true", help="no slow-link node (loopback only)")
    sc = p.add_mutually_exclusive_group()
    sc.add_argument("--compare-single", dest="compare_single", action="store_true", default=None,
                    help="after the run, train one node alone to the swarm's last evaluated round and compare val "
                         "loss (default: on for --duration >= 600)")
    sc.add_argument("--no-compare-single", dest="compare_single", action="store_false")
    p.add_argument("--interval", type=float, default=8.0, help="mean seconds between actions (default 8)")
    p.add_argument("--calm", type=float,
                   help="seconds without actions at the end of every --calm-every seconds, for the paired share "
                        "away from churn (default 60 for --duration >= 600, else 0)")
    p.add_argument("--calm-every", type=float, default=300.0, help="see --calm (default 300)")
    p.add_argument("--poll", type=float, default=1.0, help="seconds between status polls of a node (default 1)")
    p.add_argument("--flood-connections", type=int, default=400)
    p.add_argument("--flood-hold", type=float, help="seconds the flood's connections stay open (default: 15%% of "
                   "the duration, 15-60 s)")
    p.add_argument("--no-flood", action="store_true")
    p.add_argument("--no-double-start", action="store_true")
    p.add_argument("--address-flood-connections", type=int, default=1000,
                   help="connections of the address flood a joiner must get past (default 1000, from 100 addresses)")
    p.add_argument("--no-attacks", action="store_true",
                   help="skip the attack probes (control rapid reset, stranger frames, address flood, poisoned donor, "
                        "flipping member)")
    p.add_argument("--daemon-nofile", type=int, default=1024,
                   help="soft RLIMIT_NOFILE of every starlingd (default 1024, a Linux shell's usual limit)")
    p.add_argument("--resume-bound", type=float, default=30.0,
                   help="seconds a restarted node has to answer at or past its checkpoint (default 30)")
    p.add_argument("--join-bound", type=float, default=30.0,
                   help="seconds a joiner has to copy the swarm's state (default 30)")
    p.add_argument("--natted", type=int, default=0,
                   help="this many of the --nodes (never n0) behind NAT routers, masquerading and firewalled in "
                        "turn, in network namespaces (chaoslib/nat.py); the public nodes and the slow link then "
                        "join the topology's internet (default 0)")
    p.add_argument("--set", dest="settings", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="a config key every node (and the single-node comparison) runs with, over pico.toml's and "
                        "the suite's own, e.g. --set swarm.method=diloco --set exchange.delta_codec=TOPK; repeatable")
    args = p.parse_args(argv)
    try:
        args.settings = [cfgmod.parse_setting(s) for s in args.settings]
    except ValueError as e:
        p.error(str(e))
    if args.duration is None:
        args.duration = 110.0 if args.short else 1800.0
    if args.nodes is None:
        args.nodes = 3 if args.short else 5
    if args.compare_single is None:
        args.compare_single = args.duration >= 600 and not args.short
    if args.calm is None:
        args.calm = 60.0 if args.duration >= 600 else 0.0
    if args.calm < 0 or (args.calm > 0 and args.calm >= args.calm_every):
        p.error("--calm must be >= 0 and shorter than --calm-every")
    if args.flood_hold is None:
        args.flood_hold = min(60.0, max(15.0, 0.15 * args.duration))
    if args.duration < 60:
        p.error("--duration must be at least 60 s")
    if args.nodes < 2:
        p.error("--nodes must be at least 2")
    if not 0 <= args.natted < args.nodes:
        p.error("--natted must be at least 0 and fewer than --nodes (n0, the seed, is public)")
    if args.interval < 1 or args.poll < 0.2 or args.poll > 5:
        p.error("--interval must be >= 1 s and --poll within 0.2-5 s")
    if args.flood_connections < 1 or args.address_flood_connections < 100:
        p.error("--flood-connections must be at least 1 and --address-flood-connections at least 100")
    return args


def say(msg):
    print(msg, flush=True)


class Chaos:
    def __init__(self, args):
        self.args = args
        self.rng = random.Random(args.seed)
        self.instances = []  # every starlingd started, in start order
        self.nodes = []  # chaos and slow nodes
        self.link = None
        self.slow_skipped = None
        self.nat = None  # the NAT topology of --natted (chaoslib/nat.py)
        self.free_hidden = []  # its hidden slots that no node holds
        self.ports = PortPicker()
        self.actions = {k: 0 for k in ["kill9", "term", "leave", "join", "retire", "stop"]}
        self.skipped = 0
        self.churn_walls = []  # Unix times of every action, restart and SIGCONT
        self.crashes = []
        self.drains_ok = []
        self.drains_hung = []
        self.resumes = []
        self.joins = []
        self.startup_failures = []
        self.cont_at = {}
        self.t0 = None
        self.flood = {"skipped": "not run"}
        self.double = {"skipped": "not run"}
        self.attacks = [] if args.no_attacks else hostile.default_probes(args)
        self.rate_changed_wall = None
        self.max_alive = 0
        self.end_statuses = {}
        self.end_instances = []
        self.single = {}
        self.tearing_down = False

    # ---- setup ---------------------------------------------------------------------------------

    def setup(self):
        a = self.args
        self.bin = Path(a.bin).resolve()
        self.starlingd = self.bin / "starlingd"
        self.starling = self.bin / "starling"
        for exe in (self.starlingd, self.starling):
            if not os.access(exe, os.X_OK):
                raise UsageError(f"{exe} is not an executable (build first, or --bin DIR)")
        self.cli = daemons.Cli(self.starling)
        pico = REPO / "configs" / "pico.toml"
        if not pico.is_file():
            raise UsageError(f"{pico} missing")
        self.data = Path(a.data).resolve()
        if not (list(self.data.glob("train_*.bin")) and list(self.data.glob("val_*.bin"))):
            say(f"chaos: no shards in {self.data}: running `starling data prepare --out {self.data}`")
            p = subprocess.run([str(self.starling), "data", "prepare", "--out", str(self.data)], capture_output=True,
                               text=True)
            if p.returncode != 0:
                raise UsageError(f"`starling data prepare --out {self.data}` failed: {(p.stderr or p.stdout).strip()}")
        if a.work:
            self.work = Path(a.work).resolve()
            if self.work.exists() and (not self.work.is_dir() or any(self.work.iterdir())):
                raise UsageError(f"--work {self.work} is not an empty directory (the run needs a fresh work dir)")
            try:
                self.work.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise UsageError(f"--work {self.work}: {e}")
        else:
            self.work = Path(tempfile.mkdtemp(prefix="starling-chaos-", dir="/tmp"))
        (self.work / "logs").mkdir()
        (self.work / "nodes").mkdir()
        steps = 10_000_000
        self.config, self.single_config, parsed = cfgmod.write_configs(pico, self.work, self.data, steps,
                                                                             self.args.settings)
        self.settings = cfgmod.Settings(parsed)
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("STARLING_")}
        self.env["STARLING_PEER_SECRET"] = "chaos-" + secrets.token_hex(16)
        self.env["STARLING_TRAIN_THREADS"] = "1"
        # This script holds the floods' sockets; the daemons keep --daemon-nofile.
        self.nofile_before, self.nofile_now = probes.raise_nofile(
            max(a.flood_connections, a.address_flood_connections) + 256)
        if self.nofile_now < a.flood_connections + 64:
            say(f"chaos: RLIMIT_NOFILE {self.nofile_now} too low for {a.flood_connections} connections: the flood "
                f"opens {self.nofile_now - 64}")
            a.flood_connections = max(1, self.nofile_now - 64)
        import resource
        hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        self.daemon_nofile = a.daemon_nofile if hard == resource.RLIM_INFINITY else min(a.daemon_nofile, hard)
        self.ncpu = os.cpu_count() or 1
        self.host = "127.0.0.1"
        if a.natted:
            self.setup_nat()
        if a.no_netns:
            self.slow_skipped = "--no-netns"
        else:
            link = netlink.SlowLink(10, host_ns=self.nat.public_ns if self.nat else None)
            why = link.why_unavailable()
            if why:
                self.slow_skipped = why
            else:
                try:
                    self.link = link
                    link.setup()
                    if self.nat:
                        self.nat.route_to(link.net)
                    else:
                        self.host = link.root_ip
                except RuntimeError as e:
                    self.slow_skipped = f"`ip netns`/tc failed: {e}"
                    link.cleanup()
                    self.link = None
        if self.slow_skipped:
            say(f"chaos: slow link skipped: {self.slow_skipped}")
        say(f"chaos: seed {a.seed}, {a.duration:.0f} s, {a.nodes} nodes"
            f"{' + 1 behind the slow link' if self.link else ''}, binaries {self.bin}, work dir {self.work}")
        if self.link:
            say(f"chaos: slow link: {self.link.describe()}")
        if self.nat:
            say(f"chaos: {a.natted} node(s) behind NAT:\n{self.nat.describe()}")

    def setup_nat(self):
        why = nat.why_unavailable()
        if why:
            raise UsageError(f"--natted: {why}")
        kinds = [nat.KINDS[k % len(nat.KINDS)] for k in range(self.args.natted)]
        self.nat = nat.NatTopology(kinds)
        try:
            self.nat.setup()
            self.host = self.nat.attach_root()
        except RuntimeError as e:
            self.nat.cleanup()
            raise UsageError(f"--natted: the NAT topology failed: {e}")
        self.free_hidden = list(self.nat.hidden)

    def free_port(self, host):
        try:
            return self.ports.free_port(host)
        except RuntimeError as e:
            raise UsageError(str(e))

    def argv(self, node, config, seeds):
        argv = (node.command or [str(self.starlingd)]) + ["--config", str(config), "--data-dir", str(node.data_dir), "--listen",
                node.listen, "--announce", node.listen, "--control", node.control, "--metrics", ""]
        for s in seeds:
            argv += ["--seed", s]
        return argv

    def new_node(self, name, role="chaos", hidden=None):
        """A node in the root namespace, behind the slow link (role "slow"), or behind the NAT
        router of `hidden` (--natted), which it holds until it retires."""
        if role == "slow":
            node = Node(name, self.work / "nodes" / name, f"{self.link.ns_ip}:7700",
                        f"unix:{self.work / (name + '.sock')}", netns=self.link.ns, role=role)
        elif hidden:
            # A new port for each node the slot holds: a retiring one may still hold the last.
            hidden.nodes_held += 1
            node = Node(name, self.work / "nodes" / name, f"{hidden.ip}:{7699 + hidden.nodes_held}",
                        f"unix:{self.work / (name + '.sock')}", netns=hidden.ns, role=role)
            node.hidden = hidden
            self.free_hidden.remove(hidden)
        else:
            node = Node(name, self.work / "nodes" / name, f"{self.host}:{self.free_port(self.host)}",
                        f"127.0.0.1:{self.free_port('127.0.0.1')}", role=role)
        self.nodes.append(node)
        return node

    def start(self, node, kind, seeds, config=None, poll=True):
        inst = Instance(node, len(node.instances), kind, self.work / "logs" / f"{node.name}.{len(node.instances)}.log")
        node.instances.append(inst)
        inst.start(self.argv(node, config or self.config, seeds), dict(self.env, **node.env),
                   self.daemon_nofile)
        self.instances.append(inst)
        if poll:
            inst.start_polling(self.cli, self.args.poll)
        return inst

    def seeds_for(self, node):
        # Not a node behind NAT: nobody can dial it.
        others = [n.current for n in self.nodes
                  if n is not node and not n.hidden and n.current and n.current.running()]
        others.sort(key=lambda i: (i.node.role != "chaos", i.node.name))
        return [i.node.listen for i in others[:3]]

    def t(self):
        return now() - self.t0 if self.t0 else 0.0

    def note(self, msg):
        say(f"[{self.t():6.1f} s] {msg}")

    # ---- calibration ---------------------------------------------------------------------------

    def calibrate(self):
        """One node alone, method local, on an idle machine: how long a round's inner phase (and a
        round with an evaluation and a checkpoint) takes here."""
        node = Node("calibration", self.work / "nodes" / "calibration",
                    f"127.0.0.1:{self.free_port('127.0.0.1')}", f"127.0.0.1:{self.free_port('127.0.0.1')}")
        inst = Instance(node, 0, "calibration", self.work / "logs" / "calibration.log")
        node.instances.append(inst)
        inst.start(self.argv(node, self.single_config, []), self.env, self.daemon_nofile)
        self.instances.append(inst)
        deadline = now() + 60
        rounds = []
        while now() < deadline and inst.proc.poll() is None:
            rounds = logs.parse(inst.log_path).rounds
            if len(rounds) >= 14:
                break
            time.sleep(0.5)
        status, _ = self.cli.status(node.control)
        inst.expected = "term"
        inst.signal(signal.SIGTERM)
        try:
            rc = inst.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            inst.signal(signal.SIGKILL)
            rc = inst.proc.wait()
        inst.exit_code = rc
        inst.finished.set()
        rounds = logs.parse(inst.log_path).rounds
        if len(rounds) < 12 or rc != 0:
            raise UsageError(f"calibration node (alone, method local) did not run 12 rounds and exit 0 "
                             f"(rounds {len(rounds)}, exit {rc}); log {inst.log_path}:\n{logs.tail(inst.log_path)}")
        gaps = [b.wall - a.wall for a, b in zip(rounds, rounds[1:])]
        self.solo_round_median = statistics.median(gaps)
        self.solo_round_max = max(gaps)
        tps = status.get("tokens_per_second") if status else None
        self.solo_inner = (self.settings.inner_steps * self.settings.tokens_per_step / tps) if tps else None
        say(f"chaos: calibration (one node alone, 1 thread): round {self.solo_round_median:.3f} s median, "
            f"{self.solo_round_max:.3f} s slowest (with evaluation/checkpoint)"
            + (f", inner phase {self.solo_inner:.3f} s from tokens/s" if self.solo_inner else ""))

    # ---- the swarm -----------------------------------------------------------------------------

    def wait_answer(self, inst, limit):
        deadline = now() + limit
        while now() < deadline:
            if inst.poll_exit() is not None:
                return False
            if inst.first_answer is not None:
                return True
            time.sleep(0.2)
        return False

    def start_swarm(self):
        a = self.args
        self.t0 = now()
        first = self.new_node("n0")
        i0 = self.start(first, "initial", [])
        if not self.wait_answer(i0, 30):
            self.startup_failures.append({"instance": i0.label, "what": "did not answer `starling status` within 30 s",
                                          "log": str(i0.log_path)})
            return False
        for k in range(1, a.nodes):
            hidden = self.free_hidden[0] if k >= a.nodes - a.natted else None
            self.start(self.new_node(f"n{k}", hidden=hidden), "initial", [first.listen])
        if self.link:
            self.start(self.new_node("s0", role="slow"), "initial", [first.listen])
        deadline = now() + 60
        pending = [n.current for n in self.nodes]
        while pending and now() < deadline:
            self.check_exits()
            pending = [i for i in pending if i.alive and not (i.last_status and int(i.last_status.get("round", 0)) >= 1
                                                             and i.last_status.get("peers_alive", 0) >= 1)]
            time.sleep(0.3)
        for inst in pending:
            self.startup_failures.append({"instance": inst.label, "what": "not training with a peer (round >= 1, "
                                          "1+ peer alive) within 60 s", "log": str(inst.log_path),
                                          "last_status": inst.last_status, "status_error": inst.last_failure})
        self.note(f"swarm up: {', '.join(f'{n.name} {n.listen}' for n in self.nodes)}")
        return not self.startup_failures and not self.crashes

    # ---- events --------------------------------------------------------------------------------

    def record_crash(self, inst, what):
        self.crashes.append({"instance": inst.label, "what": what, "exit": inst.exit_code, "at_s": round(self.t(), 1),
                             "log": str(inst.log_path)})
        self.note(f"CRASH {inst.label}: {what}")

    def check_exits(self):
        for inst in self.instances:
            if inst.exit_code is not None or inst.proc is None or inst.kind in ("calibration", "single"):
                continue
            rc = inst.poll_exit()
            if rc is None:
                continue
            node = inst.node
            why = inst.expected
            if why in ("kill", "kill-after-hang"):
                pass
            elif why in ("term", "leave", "retire", "teardown"):
                if rc == 0:
                    self.drains_ok.append({"instance": inst.label, "how": why,
                                           "seconds": round(inst.exited_at - inst.expected_at, 2)})
                else:
                    self.record_crash(inst, f"exit {rc} after {why} (expected 0)")
            else:
                sig = f"signal {signal.Signals(-rc).name}" if rc < 0 else f"exit {rc}"
                self.record_crash(inst, f"{sig} without being asked")
                if not self.tearing_down and not node.retired and node.pending is None:
                    node.pending = {"kind": "restart after crash", "delay": 2.0}
            if node.pending is not None and node.pending.get("at") is None:
                node.pending["at"] = inst.exited_at + node.pending["delay"]

    def check_drains(self):
        t = now()
        for inst in self.instances:
            if inst.alive and inst.drain_deadline and t > inst.drain_deadline and inst.expected != "kill-after-hang":
                self.drains_hung.append({"instance": inst.label, "how": inst.expected,
                                         "seconds": round(t - inst.expected_at, 1), "log": str(inst.log_path),
                                         "last_phase": daemons.phase_name(inst.last_status or {})})
                self.note(f"DRAIN HUNG {inst.label}: no exit {t - inst.expected_at:.0f} s after {inst.expected}; "
                          f"kill -9")
                inst.expected = "kill-after-hang"
                inst.signal(signal.SIGCONT)
                inst.signal(signal.SIGKILL)

    def do_restarts(self):
        t = now()
        for node in self.nodes:
            p = node.pending
            if p is None or p.get("at") is None or t < p["at"] or (node.current and node.current.alive):
                continue
            node.pending = None
            self.churn_walls.append(time.time())
            ckpt = node.newest_checkpoint_round()
            seeds = self.seeds_for(node)
            if ckpt is not None:
                inst = self.start(node, "resume", seeds)
                inst.verify = {"type": "resume", "checkpoint_round": ckpt, "deadline": t + self.args.resume_bound,
                               "result": None, "why": p["kind"]}
                self.note(f"restart {inst.label} ({p['kind']}) on its data dir: checkpoint of round {ckpt} on disk")
            else:
                need = self.swarm_min_round()
                inst = self.start(node, "restart-fresh", seeds)
                inst.verify = {"type": "join", "need_round": need, "deadline": t + self.join_bound(),
                               "result": None, "why": f"{p['kind']}, no checkpoint on disk"}
                self.note(f"restart {inst.label} ({p['kind']}) without a checkpoint: must join at round >= {need}")

    def do_conts(self):
        t = now()
        for inst, at in list(self.cont_at.items()):
            if t >= at:
                del self.cont_at[inst]
                self.churn_walls.append(time.time())
                with inst.lock:
                    inst.epoch += 1
                    inst.stopped = False
                inst.signal(signal.SIGCONT)
                if inst.stops and inst.stops[-1][1] is None:
                    inst.stops[-1][1] = time.time()
                self.note(f"SIGCONT {inst.label}")

    def swarm_min_round(self):
        rounds = [int(i.last_status.get("round", 0)) for i in self.instances
                  if i.running() and i.last_status and (i.verify is None or i.verify["result"] is not None)]
        return max(1, min(rounds)) if rounds else 1

    def check_verifications(self, final=False):
        t = now()
        for inst in self.instances:
            v = inst.verify
            if v is None or v["result"] is not None:
                continue
            lg = None
            if v["type"] == "resume":
                if inst.first_answer is not None:
                    first_round = int(inst.first_answer[1].get("round", 0))
                    lg = logs.parse(inst.log_path)
                    if lg.resumed_round is not None:
                        ok = lg.resumed_round >= v["checkpoint_round"] and first_round >= v["checkpoint_round"]
                        self.finish_verify(inst, ok, f"resumed at round {lg.resumed_round} (log), first status round "
                                           f"{first_round}, newest checkpoint on disk {v['checkpoint_round']}")
                        continue
            else:
                st = inst.last_status
                if st is not None and int(st.get("round", 0)) >= v["need_round"]:
                    lg = logs.parse(inst.log_path)
                    if lg.joined_round is not None:
                        self.finish_verify(inst, True, f"copied the swarm's state at round {lg.joined_round}, at round "
                                           f"{st.get('round')} after {t - inst.started:.1f} s (needed "
                                           f">= {v['need_round']})")
                        continue
            if not inst.alive:
                self.finish_verify(inst, False, f"exited ({inst.exit_code}) before it was verified")
            elif t > v["deadline"] or final:
                st = inst.last_status or {}
                lg = lg or logs.parse(inst.log_path)
                self.finish_verify(inst, False, f"not within {v['deadline'] - inst.started:.0f} s: status round "
                                   f"{st.get('round', '-')} phase {daemons.phase_name(st) or '-'}, log resumed "
                                   f"{lg.resumed_round}, joined {lg.joined_round}; "
                                   + (f"needed resume >= {v['checkpoint_round']}" if v["type"] == "resume" else
                                      f"needed round >= {v['need_round']} from a snapshot")
                                   + (f"; status error: {inst.last_failure}" if inst.last_failure else ""))

    def finish_verify(self, inst, ok, detail):
        v = inst.verify
        v["result"] = ok
        v["detail"] = detail
        v["seconds"] = round(now() - inst.started, 1)
        row = {"instance": inst.label, "ok": ok, "detail": detail, "why": v["why"], "seconds": v["seconds"],
               "log": str(inst.log_path)}
        (self.resumes if v["type"] == "resume" else self.joins).append(row)
        self.note(f"{v['type']} {'ok' if ok else 'FAILED'} {inst.label}: {detail}")

    # ---- actions -------------------------------------------------------------------------------

    def running(self):
        return [i for i in self.instances if i.kind not in ("calibration", "single") and i.running()]

    def eligible(self):
        t = now()
        out = []
        for node in self.nodes:
            inst = node.current
            if (node.role == "chaos" and not node.retired and node.pending is None and inst and inst.running()
                    and (inst.verify is None or inst.verify["result"] is not None) and node.busy_until <= t):
                out.append(inst)
        return sorted(out, key=lambda i: i.node.name)

    def reachable_eligible(self):
        """The eligible nodes this script can reach from the root namespace: the probes' targets."""
        return [i for i in self.eligible() if not i.node.hidden]

    def begin_end(self, inst, how):
        """The script starts ending this process (kill, term, leave, retire)."""
        inst.end_counting(how)
        inst.expected = how
        inst.expected_at = now()

    def drain_bound(self):
        return self.stall_bound() + 10.0

    def act(self):
        self.churn_walls.append(time.time())
        kind = self.rng.choices(ACTIONS, WEIGHTS)[0]
        running = self.running()
        eligible = self.eligible()
        if kind == "join":
            if self.join_new_node() is None:
                self.skipped += 1
                self.note("join skipped: at capacity and no node can retire without leaving < 2 running")
            return
        if not eligible or len(running) - 1 < 2:
            self.skipped += 1
            self.note(f"{kind} skipped: {len(running)} running, {len(eligible)} eligible (at least 2 must keep running)")
            return
        inst = self.rng.choice(eligible)
        node = inst.node
        rnd = (inst.last_status or {}).get("round", "-")
        self.actions[kind] += 1
        if kind == "kill9":
            delay = self.rng.uniform(1, 4)
            self.begin_end(inst, "kill")
            node.pending = {"kind": "after kill -9", "delay": delay}
            inst.signal(signal.SIGKILL)
            self.note(f"kill -9 {inst.label} (round {rnd}); restart {delay:.1f} s after it exits")
        elif kind == "term":
            self.term(inst)
        elif kind == "leave":
            delay = self.rng.uniform(1, 4)
            node.pending = {"kind": "after leave", "delay": delay}
            self.leave(inst, "leave")
            self.note(f"starling leave {inst.label} (round {rnd}); restart {delay:.1f} s after it exits")
        elif kind == "stop":
            secs = self.rng.uniform(3, 8)
            inst.end_counting("SIGSTOP")
            with inst.lock:
                inst.stopped = True
            inst.stops.append([time.time(), None])
            inst.signal(signal.SIGSTOP)
            self.cont_at[inst] = now() + secs
            self.note(f"SIGSTOP {inst.label} (round {rnd}) for {secs:.1f} s")

    def join_new_node(self, seeds=None, why="new node", make_room=True):
        """Starts a new chaos node, which must copy the swarm's state within the join bound, after
        retiring one when the swarm is at --nodes and `make_room` (a probe's joiner is one more);
        returns its instance, or None when no node could retire without leaving fewer than 2
        running."""
        self.churn_walls.append(time.time())
        members = [n for n in self.nodes if n.role == "chaos" and not n.retired]
        if make_room and len(members) >= self.args.nodes:
            eligible = self.eligible()
            if not eligible or len(self.running()) - 1 < 2:
                return None
            self.retire(self.rng.choice(eligible))
        # A joiner takes the NAT slot a retired node left, so the share behind NAT holds.
        node = self.new_node(f"n{len([n for n in self.nodes if n.role == 'chaos'])}",
                             hidden=self.free_hidden[0] if self.free_hidden else None)
        need = self.swarm_min_round()
        seeds = seeds or self.seeds_for(node)
        inst = self.start(node, "join", seeds)
        inst.verify = {"type": "join", "need_round": need, "deadline": now() + self.join_bound(),
                       "result": None, "why": why}
        self.actions["join"] += 1
        self.note(f"join: new node {inst.label} on {node.listen}, seeds {', '.join(seeds)}; must reach round >= "
                  f"{need} from a snapshot")
        return inst

    def term(self, inst, why=""):
        """SIGTERM, which must end in exit 0 within the drain bound; restarted 1-4 s after."""
        self.churn_walls.append(time.time())
        delay = self.rng.uniform(1, 4)
        self.begin_end(inst, "term")
        inst.drain_deadline = now() + self.drain_bound()
        inst.node.pending = {"kind": "after SIGTERM", "delay": delay}
        inst.signal(signal.SIGTERM)
        self.note(f"SIGTERM {inst.label} (round {(inst.last_status or {}).get('round', '-')}{', ' + why if why else ''}); "
                  f"restart {delay:.1f} s after it exits")

    def leave(self, inst, how):
        self.begin_end(inst, how)
        inst.drain_deadline = now() + self.drain_bound()
        rc, out, err = self.cli.run(inst.node.control, "leave", timeout=10)
        if rc != 0:
            self.note(f"`starling leave` on {inst.label} failed ({rc}): {(err or out).strip()}; SIGTERM instead")
            self.crashes.append({"instance": inst.label, "what": f"`starling leave` exit {rc}: {(err or out).strip()}",
                                 "exit": None, "at_s": round(self.t(), 1), "log": str(inst.log_path)})
            inst.signal(signal.SIGTERM)

    def retire(self, inst):
        inst.node.retired = True
        if inst.node.hidden:
            self.free_hidden.append(inst.node.hidden)
        self.actions["retire"] += 1
        self.leave(inst, "retire")
        self.note(f"retire {inst.label}: `starling leave` for good, to make room for a joiner")

    # ---- probes --------------------------------------------------------------------------------

    def start_double_start(self):
        eligible = self.reachable_eligible()
        if not eligible:
            self.double = {"skipped": "no eligible node when it was due"}
            return
        inst = self.rng.choice(eligible)
        inst.node.busy_until = math.inf
        self.double = {"starling": str(self.starling), "started_s": round(self.t(), 1)}
        self.note(f"double-start probe on {inst.label}: its data dir, its peer port, its control port")
        self.double_inst = inst
        self.double_thread = threading.Thread(
            target=probes.double_start, daemon=True,
            args=(self.starlingd, self.config, self.env, self.daemon_nofile, inst, self.work, self.free_port, self.double))
        self.double_thread.start()

    def finish_double_start(self):
        inst = self.double_inst
        inst.node.busy_until = now() + 5
        self.double["alive"] = inst.alive
        self.double["ok"] = (all(a["refused"] for a in self.double["attempts"]) and self.double["target_answers"]
                             and inst.alive)
        for a in self.double["attempts"]:
            self.note(f"double start, {a['case']}: " + ("kept running 10 s (killed)" if a["kept_running"] else
                                                        f"exit {a['exit']} after {a['seconds']} s: {a['said']}"))
        self.double_thread = None

    def start_flood(self):
        eligible = self.reachable_eligible()
        if not eligible:
            self.flood = {"skipped": "no eligible node when it was due"}
            return
        inst = self.rng.choice(eligible)
        inst.node.busy_until = math.inf
        host, port = inst.node.listen.rsplit(":", 1)
        self.flood = {"started_s": round(self.t(), 1), "started_wall": time.time()}
        self.flood_inst = inst
        self.note(f"preface flood on {inst.label} ({host}:{port}): {self.args.flood_connections} connections held "
                  f"{self.args.flood_hold:.0f} s (daemon RLIMIT_NOFILE {self.daemon_nofile})")
        self.flood_thread = threading.Thread(
            target=probes.flood, daemon=True,
            args=(self.cli, inst, host, int(port), self.args.flood_connections, self.args.flood_hold, self.flood))
        self.flood_thread.start()

    def finish_flood(self):
        inst = self.flood_inst
        inst.node.busy_until = now() + 5
        lg = logs.parse(inst.log_path)
        fd_errors = [l for w, l in lg.fd_errors if w is None or w >= self.flood["started_wall"] - 1]
        self.flood["fd_errors"] = len(fd_errors)
        self.flood["fd_error_lines"] = fd_errors[:5]
        self.flood["alive"] = inst.alive
        answered = all(s["answered"] for s in self.flood["status"])
        self.flood["ok"] = (inst.alive and answered and self.flood["opened"] == self.flood["connections"]
                            and not fd_errors)
        self.note(f"flood done on {inst.label}: opened {self.flood['opened']}, closed by node "
                  f"{self.flood['closed_by_node']}, fds max {self.flood['fds_max']}, status "
                  + ", ".join(f"{s['when']} {'ok' if s['answered'] else 'FAILED (' + s['error'] + ')'}"
                              for s in self.flood["status"]) + f", {'alive' if inst.alive else 'EXITED'}")
        self.flood_thread = None

    # ---- the run -------------------------------------------------------------------------------

    def alive_count(self):
        return sum(1 for i in self.instances if i.kind not in ("calibration", "single") and i.alive)

    def pending_work(self):
        return (any(n.pending for n in self.nodes) or self.cont_at
                or any(i.verify and i.verify["result"] is None for i in self.instances)
                or any(i.alive and i.drain_deadline and i.expected in ("term", "leave", "retire") for i in self.instances)
                or getattr(self, "flood_thread", None) or getattr(self, "double_thread", None)
                or any(p.started and not p.done for p in self.attacks))

    def run_chaos(self):
        a = self.args
        start = now()
        end = start + a.duration
        settle = min(30.0, 0.2 * a.duration)
        action_end = end - settle
        next_action = start + a.interval * self.rng.uniform(0.75, 1.25)
        double_at = start + 0.15 * a.duration if not a.no_double_start else math.inf
        flood_at = start + 0.35 * a.duration if not a.no_flood else math.inf
        rate_at = start + 0.5 * a.duration if self.link else math.inf
        if a.no_double_start:
            self.double = {"skipped": "--no-double-start"}
        if a.no_flood:
            self.flood = {"skipped": "--no-flood"}
        for p in self.attacks:
            p.due = start + p.due_fraction * a.duration
        self.double_thread = self.flood_thread = None
        self.note(f"chaos for {a.duration:.0f} s: actions every ~{a.interval:.0f} s until {action_end - self.t0:.0f} s"
                  + (f", none in the last {a.calm:.0f} s of every {a.calm_every:.0f} s" if a.calm else ""))
        while True:
            t = now()
            self.check_exits()
            self.check_drains()
            self.do_restarts()
            self.do_conts()
            self.check_verifications()
            if self.double_thread is not None and not self.double_thread.is_alive():
                self.finish_double_start()
            if self.flood_thread is not None and not self.flood_thread.is_alive():
                self.finish_flood()
            self.drive_attacks(t < action_end)
            self.max_alive = max(self.max_alive, self.alive_count())
            if t >= end:
                if not self.pending_work() or t >= end + 90:
                    break
            elif t < action_end:
                if t >= double_at:
                    double_at = math.inf
                    self.start_double_start()
                if t >= flood_at:
                    flood_at = math.inf
                    self.start_flood()
                if t >= rate_at:
                    rate_at = math.inf
                    try:
                        self.link.set_rate(1)
                        self.rate_changed_wall = time.time()
                        self.note("slow link: 10 -> 1 Mbit/s each way")
                    except RuntimeError as e:
                        self.note(f"slow link: rate change failed: {e}")
                if t >= next_action and not self.calm_at(t - start):
                    self.act()
                    next_action = t + a.interval * self.rng.uniform(0.5, 1.5)
            time.sleep(0.2)
        self.check_verifications(final=True)

    def drive_attacks(self, may_start):
        """Starts each attack probe when due (later when no node can be its target yet), and
        drives the ones started until they are done."""
        for p in self.attacks:
            if p.started:
                if not p.done and p.poll(self):
                    p.done = True
                    p.finish(self)
                    self.note(f"{p.name}: {p.result['summary']}  [{p.verdict}]")
            elif may_start and now() >= p.due:
                if p.start(self):
                    p.started = True
                else:
                    p.due = now() + 2.0
            elif not may_start and p.result.get("skipped") == "not run":
                p.result = {"skipped": "no node could be its target before the actions ended"}

    def calm_at(self, elapsed):
        """Whether `elapsed` seconds into the chaos fall in a calm window (no actions)."""
        a = self.args
        return a.calm > 0 and elapsed % a.calm_every >= a.calm_every - a.calm

    def teardown(self):
        """Every node still running drains on SIGTERM, which must end in exit 0 within the drain bound."""
        self.tearing_down = True
        for inst in self.instances:
            if inst.alive and inst.kind not in ("calibration", "single"):
                inst.end_counting("end of the run")
        self.end_instances = [i for i in self.instances if i.alive and i.kind not in ("calibration", "single")
                              and i.expected is None]
        for inst in list(self.cont_at):
            inst.signal(signal.SIGCONT)
            inst.stopped = False
            if inst.stops and inst.stops[-1][1] is None:
                inst.stops[-1][1] = time.time()
        self.cont_at.clear()
        for inst in self.end_instances:
            self.end_statuses[inst.label] = inst.last_status
            self.begin_end(inst, "teardown")
            inst.drain_deadline = now() + self.drain_bound()
            inst.signal(signal.SIGTERM)
        self.note(f"end of the run: SIGTERM to {len(self.end_instances)} node(s)")
        while any(i.alive for i in self.instances if i.kind not in ("calibration", "single")):
            self.check_exits()
            self.check_drains()
            time.sleep(0.2)

    def compare_single(self, parsed_by_label):
        if not self.args.compare_single:
            self.single = {"skipped": "--compare-single not given" if self.args.duration < 600 or self.args.short
                           else "--no-compare-single"}
            return
        sw = report.swarm_val_loss(self.end_instances, parsed_by_label)
        if not sw:
            self.single = {"skipped": "the swarm logged no validation loss"}
            return
        target = sw["round"]
        node = Node("single", self.work / "nodes" / "single", f"127.0.0.1:{self.free_port('127.0.0.1')}",
                    f"127.0.0.1:{self.free_port('127.0.0.1')}")
        inst = Instance(node, 0, "single", self.work / "logs" / "single.log")
        node.instances.append(inst)
        limit = 120 + target * self.solo_round_max * 2
        self.note(f"single node (method local, same config) to round {target}: at most {limit:.0f} s")
        inst.start(self.argv(node, self.single_config, []), self.env, self.daemon_nofile)
        self.instances.append(inst)
        deadline = now() + limit
        loss = None
        while now() < deadline and inst.proc.poll() is None:
            for _, rnd, value in logs.parse(inst.log_path).vals:
                if rnd == target:
                    loss = value
            if loss is not None:
                break
            time.sleep(2)
        inst.expected = "term"
        inst.signal(signal.SIGTERM)
        try:
            inst.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            inst.signal(signal.SIGKILL)
            inst.proc.wait()
        inst.exit_code = inst.proc.returncode
        inst.finished.set()
        if loss is None:
            self.single = {"skipped": f"the single node did not log round {target}'s validation loss within "
                                      f"{limit:.0f} s (log {inst.log_path})"}
        else:
            self.single = {"value": loss, "round": target, "log": str(inst.log_path)}

    # ---- figures -------------------------------------------------------------------------------

    def contention(self):
        return max(1.0, self.max_alive / self.ncpu)

    def stall_bound(self):
        s = self.settings
        return s.pair_timeout_s + s.exchange_timeout_s + self.solo_round_max * self.contention() + 2 * self.args.poll

    def slow_copy_s(self):
        """A state copy over the slow link at its slowest rate (1 Mbit/s), half again for the
        protocol's overhead: the slow node's stalls may include one, and so may a joiner's whose
        donor is the slow node. The snapshot's size: the largest any node logged copying, else
        the largest checkpoint's state.bin (the same bytes)."""
        if not self.link:
            return 0.0
        largest = max((logs.largest_snapshot_bytes(i.log_path) for i in self.instances), default=0)
        if largest == 0:
            largest = max((p.stat().st_size for p in self.work.glob("nodes/*/checkpoints/step_*/state.bin")),
                          default=0)
        return largest * 8 / 1e6 * 1.5

    def calm_window(self):
        """How long before a round's end churn can still shape it: its pairing, exchange and
        inner phase at the worst contention."""
        s = self.settings
        return s.pair_timeout_s + s.exchange_timeout_s + self.solo_round_max * self.contention()

    def join_bound(self):
        return self.args.join_bound + self.slow_copy_s()

    def stall_bound_of(self, inst):
        return self.stall_bound() + (self.slow_copy_s() if inst.node.role == "slow" else 0.0)

    def build_report(self):
        s = self.settings
        chaos_insts = [i for i in self.instances if i.kind not in ("calibration", "single")]
        parsed = report.parse_all(chaos_insts)
        by_label = {i.label: lg for i, lg in parsed}
        self.compare_single(by_label)
        # The stall furthest over its own bound (or nearest under it).
        worst = None
        for inst in chaos_insts:
            info = inst.stall.max_info
            if info and (worst is None or info["seconds"] - self.stall_bound_of(inst) >
                         worst["seconds"] - worst["bound_s"]):
                worst = dict(info, instance=inst.label, log=str(inst.log_path), bound_s=self.stall_bound_of(inst))
                # The log's view of the interval (monotonic clock to the log's wall clock), one
                # poll interval wider on each side.
                to_wall = lambda m, i=inst: i.started_wall + (m - i.started)
                worst["wall_from"] = to_wall(info["from_s"]) - self.args.poll
                worst["wall_to"] = to_wall(info["to_s"]) + self.args.poll
        if worst:
            lines, summary = logs.window(Path(worst["log"]), worst["wall_from"], worst["wall_to"])
            worst["log_summary"] = summary
            worst["log_lines"] = lines[-40:]
        bound = worst["bound_s"] if worst else self.stall_bound()
        bound_text = (f"T_pair {s.pair_timeout_s:.1f} + T_xchg {s.exchange_timeout_s:.1f} + slowest solo round "
                      f"{self.solo_round_max:.2f} s x contention {self.contention():.1f} ({self.max_alive} starlingd / "
                      f"{self.ncpu} cores) + 2 polls {2 * self.args.poll:.1f}")
        if self.link:
            bound_text += f"; the slow node also one state copy at 1 Mbit/s x 1.5: {self.slow_copy_s():.1f}"
        rss_rows = report.rss_growth(chaos_insts)
        rss_max = max(rss_rows, key=lambda r: r["growth_pct"]) if rss_rows else None
        sw = report.swarm_val_loss(self.end_instances, by_label)
        val = {"swarm": sw}
        if self.single.get("value") is not None:
            val["single"] = self.single["value"]
            val["difference"] = round(sw["mean"] - self.single["value"], 4)
        else:
            val["single_skipped"] = self.single.get("skipped")
        slow = {"skipped": self.slow_skipped} if self.slow_skipped else {}
        if self.link:
            sn = next(n for n in self.nodes if n.role == "slow")
            figs = [report.slow_link_figures(i, by_label[i.label], self.rate_changed_wall) for i in sn.instances]
            slow = {"instance": sn.instances[0].label, "namespace": self.link.ns, "root_ip": self.link.root_ip,
                    "ns_ip": self.link.ns_ip, "figures": figs[0] if figs else {},
                    "rate_changed_at_wall": self.rate_changed_wall}
        drain_secs = [d["seconds"] for d in self.drains_ok]
        rep = {
            "seed": self.args.seed, "duration_s": self.args.duration, "nodes": self.args.nodes,
            "work_dir": str(self.work), "binaries": str(self.bin),
            "config": {"file": str(self.config), "method": s.method, "pair_timeout_s": s.pair_timeout_s,
                       "exchange_timeout_s": s.exchange_timeout_s, "inner_steps": s.inner_steps,
                       "checkpoint_every": s.checkpoint_every, "eval_every": s.eval_every,
                       "max_round_gap": s.max_round_gap, "daemon_nofile": self.daemon_nofile},
            "calibration": {"solo_round_median_s": round(self.solo_round_median, 3),
                            "solo_round_max_s": round(self.solo_round_max, 3),
                            "solo_inner_s": round(self.solo_inner, 3) if self.solo_inner else None},
            "actions": {"counts": self.actions, "skipped": self.skipped},
            "startup_failures": self.startup_failures,
            "crashes": self.crashes,
            "drains": {"ok": len(self.drains_ok), "hung": self.drains_hung, "max_s": max(drain_secs) if drain_secs
                       else None, "bound_s": round(self.drain_bound(), 1)},
            "stall": {"max_s": worst["seconds"] if worst else None, "worst": worst, "bound_s": round(bound, 2),
                      "bound_explained": bound_text,
                      "per_instance": {i.label: round(i.stall.max, 2) for i in chaos_insts}},
            "resumes": {"ok": sum(1 for r in self.resumes if r["ok"]),
                        "failed": [r for r in self.resumes if not r["ok"]], "all": self.resumes},
            "joins": {"ok": sum(1 for r in self.joins if r["ok"]), "failed": [r for r in self.joins if not r["ok"]],
                      "all": self.joins, "bound_s": round(self.join_bound(), 1),
                      "slowest_s": max((r["seconds"] for r in self.joins if r["ok"]), default=None)},
            "flood": self.flood,
            "attacks": {p.name: dict(p.result, verdict=p.verdict) for p in self.attacks},
            "double_start": {k: v for k, v in self.double.items() if k != "starling"},
            "rss": {"per_instance": rss_rows, "max": rss_max},
            "rounds": report.round_shares(parsed, self.churn_walls, self.calm_window()),
            "state_copies": report.state_copies(parsed),
            "val_loss": val,
            "slow_link": slow,
            "polls": {"ok": sum(i.status_ok for i in chaos_insts), "failed": sum(i.status_failed for i in chaos_insts)},
        }
        if self.nat:
            rep["natted"] = report.natted_figures(parsed, self.churn_walls, self.calm_window())
        stall_ok = worst is None or worst["seconds"] <= bound
        verdict = {
            "startup": "ok" if not self.startup_failures else "FAIL",
            "crashes": "ok" if not self.crashes else "FAIL",
            "drains": "ok" if not self.drains_hung else "FAIL",
            "stall": "ok" if stall_ok else "FAIL",
            "resumes": "ok" if not rep["resumes"]["failed"] else "FAIL",
            "joins": "ok" if not rep["joins"]["failed"] else "FAIL",
            "flood": "-" if self.flood.get("skipped") else ("ok" if self.flood.get("ok") else "FAIL"),
            "double_start": "-" if self.double.get("skipped") else ("ok" if self.double.get("ok") else "FAIL"),
        }
        if self.nat:
            # Judged over 50 rounds a side at least: over a short run's 10 to 25 a round or two
            # moves a share by 5 to 10 points.
            nt = rep["natted"]
            judged = min(nt["natted"]["rounds"], nt["public"]["rounds"]) >= 50
            verdict["natted"] = ("info" if not judged else "ok"
                                 if nt["natted"]["paired_pct"] >= 0.9 * nt["public"]["paired_pct"] else "FAIL")
        verdict.update({p.name: p.verdict for p in self.attacks})
        rep["verdict"] = verdict
        rep["failed_checks"] = [k for k, v in verdict.items() if v == "FAIL"]
        return rep

    def print_failures(self, rep):
        shown = set()

        def show(path, why):
            if path in shown or not path:
                return
            shown.add(path)
            say(f"\n--- {why}: tail of {path}")
            say(logs.tail(Path(path), 25))

        for f in rep["startup_failures"]:
            show(f["log"], f"startup {f['instance']}: {f['what']}")
        for c in rep["crashes"]:
            show(c["log"], f"crash {c['instance']}: {c['what']}")
        for d in rep["drains"]["hung"]:
            show(d["log"], f"drain hung {d['instance']}")
        if rep["verdict"]["stall"] == "FAIL":
            w = rep["stall"]["worst"]
            shown.add(w["log"])
            say(f"\n--- stall {w['instance']} {w['seconds']} s at round {w['round']}: its log over the stall "
                f"({w['log']})")
            say("\n".join(w["log_lines"]) or "(no log lines in that interval)")
        for r in rep["resumes"]["failed"] + rep["joins"]["failed"]:
            show(r["log"], f"{r['instance']}: {r['detail']}")
        if rep["verdict"]["flood"] == "FAIL":
            show(str(self.flood_inst.log_path), "flood target")
        if rep["verdict"]["double_start"] == "FAIL":
            for a in rep["double_start"].get("attempts", []):
                if not a["refused"]:
                    show(a["log"], f"second starlingd, {a['case']}")
            show(str(self.double_inst.log_path), "double-start target")
        for p in self.attacks:
            if p.verdict == "FAIL":
                for key in ("target", "poisoned", "faulty", "joiner"):
                    inst = next((i for i in self.instances if i.label == p.result.get(key)), None)
                    if inst:
                        show(str(inst.log_path), f"{p.name}, {key}")

    def cleanup(self):
        daemons.kill_all(self.instances)
        if self.link:
            self.link.cleanup()
        if self.nat:
            self.nat.cleanup()


def main(argv):
    args = parse_args(argv)
    chaos = Chaos(args)

    def interrupted(signum, _frame):
        raise Interrupted(signal.Signals(signum).name)

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, interrupted)
    code = 2
    try:
        chaos.setup()
        chaos.calibrate()
        if chaos.start_swarm():
            chaos.run_chaos()
        else:
            say("chaos: the swarm did not come up; no chaos run")
        chaos.teardown()
        rep = chaos.build_report()
        say("")
        settings = "".join(f", {sec}.{key} = {value!r}" for sec, key, value in args.settings)
        say(f"chaos results (seed {args.seed}, {args.duration:.0f} s{settings}, logs in {chaos.work}/logs)")
        say(report.table(rep))
        if args.json:
            report.write_json(args.json, rep)
            say(f"(JSON: {args.json})")
        if rep["failed_checks"]:
            chaos.print_failures(rep)
            say(f"\nchaos: FAILED: {', '.join(rep['failed_checks'])} (logs in {chaos.work}/logs)")
            code = 1
        else:
            say(f"\nchaos: all checks held (logs in {chaos.work}/logs)")
            code = 0
    except UsageError as e:
        say(f"chaos: {e}")
        code = 2
    except Interrupted as e:
        say(f"chaos: interrupted ({e}); no verdict")
        code = 2
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)
        chaos.cleanup()
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_DFL)
    return code
