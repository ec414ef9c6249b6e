"""starlingd processes: starting them (in a network namespace or not), polling `starling status
--json` and VmRSS once a poll interval on a thread per process, and measuring round stalls."""

import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path


def now():
    return time.monotonic()


class StallTracker:
    """Longest time between first seeing a round and first seeing a different one, over the time
    the process ran unstopped. close() ends an interval where the process stops counting (SIGSTOP,
    a kill or drain the script started, the end of the run): the time so far is a stall candidate
    too, since the node was running until then."""

    def __init__(self, grace_phases=()):
        # A fresh node's first phases (starting, joining: waiting for a donor and copying the
        # state) are the join check's, with its own bound; the clock starts after them.
        self.grace_phases = set(grace_phases)
        self.since = None
        self.round = None
        self.phases = set()
        self.max = 0.0
        self.max_info = None

    def observe(self, t, rnd, phase):
        if self.grace_phases:
            if phase in self.grace_phases:
                return
            self.grace_phases = set()
        if self.since is None:
            self.since, self.round, self.phases = t, rnd, {phase}
            return
        if rnd != self.round:
            self._record(t, f"advanced to round {rnd}")
            self.since, self.round, self.phases = t, rnd, {phase}
        else:
            self.phases.add(phase)

    def close(self, t, why):
        if self.since is not None:
            self._record(t, why)
        self.since = None

    def open_seconds(self, t):
        return 0.0 if self.since is None else t - self.since

    def _record(self, t, ended):
        d = t - self.since
        if d > self.max:
            self.max = d
            self.max_info = {"round": self.round, "seconds": round(d, 2), "from_s": self.since, "to_s": t,
                             "phases": sorted(p for p in self.phases if p), "ended": ended}


def phase_name(status):
    p = status.get("phase", "")
    return p.replace("NODE_PHASE_", "").lower()


def proc_status(pid, *keys):
    """The given fields of /proc/PID/status as integers (the number before any unit), or None when
    the process is gone or one is missing."""
    fields = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                key, _, rest = line.partition(":")
                if key in keys:
                    fields[key] = int(rest.split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return fields if len(fields) == len(keys) else None


def read_rss_kb(pid):
    """(VmRSS, RssAnon) in kB: all resident pages, and the heap and stacks alone (a creep shows
    there; resident library code grows as new code paths run and is not a leak)."""
    fields = proc_status(pid, "VmRSS", "RssAnon")
    return (fields["VmRSS"], fields["RssAnon"]) if fields else None


def pid_running(pid):
    """The process exists and has not ended (a zombie not yet reaped has ended)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False


def count_fds(pid):
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None


class Cli:
    def __init__(self, starling):
        self.starling = str(starling)

    def run(self, control, *args, timeout=10):
        try:
            p = subprocess.run([self.starling, "--control", control, *args], capture_output=True, text=True,
                               timeout=timeout, stdin=subprocess.DEVNULL)
            return p.returncode, p.stdout, p.stderr
        except subprocess.TimeoutExpired:
            return 124, "", f"starling {' '.join(args)}: no answer within {timeout} s"

    def status(self, control, timeout=10):
        rc, out, err = self.run(control, "status", "--json", timeout=timeout)
        if rc != 0:
            return None, (err or out).strip()
        try:
            return json.loads(out), ""
        except ValueError as e:
            return None, f"unparsable status JSON ({e}): {out[:200]}"


class Node:
    """One node identity: a data dir and its addresses; restarted as new Instances."""

    def __init__(self, name, data_dir, listen, control, netns=None, role="chaos"):
        self.name = name
        self.data_dir = Path(data_dir)
        self.listen = listen  # host:port, also what it announces
        self.control = control  # host:port or unix:/path
        self.netns = netns
        self.role = role  # "chaos" (a target of the actions), "slow" (behind the shaped link)
        self.hidden = None  # its slot behind a NAT router (chaos --natted, chaoslib/nat.py)
        self.command = None  # what runs in place of starlingd, before its arguments (every instance)
        self.env = {}  # more environment for every instance, restarts included (a probe's faulty config)
        self.instances = []
        self.pending = None  # {"kind": ..., "delay": s, "at": monotonic or None} restart to come
        self.retired = False
        self.busy_until = 0.0  # a probe is using it: no actions

    @property
    def current(self):
        return self.instances[-1] if self.instances else None

    def newest_checkpoint_round(self):
        """The newest round among the complete checkpoints on disk (step_* with checkpoint.json and
        state.bin; hidden staging directories are not checkpoints)."""
        best = None
        root = self.data_dir / "checkpoints"
        if not root.is_dir():
            return None
        for d in root.iterdir():
            if not d.name.startswith("step_"):
                continue
            try:
                meta = json.loads((d / "checkpoint.json").read_text())
                if (d / "state.bin").is_file():
                    r = int(meta["round"])
                    best = r if best is None else max(best, r)
            except (OSError, ValueError, KeyError):
                continue
        return best


class Instance:
    """One process of a node: from start to exit."""

    def __init__(self, node, index, kind, log_path):
        self.node = node
        self.index = index
        self.kind = kind  # initial, resume, join, restart-fresh
        self.log_path = Path(log_path)
        self.proc = None
        self.pid = None
        self.started = None
        self.started_wall = None
        self.expected = None  # why the script ended it: kill, term, leave, retire, teardown
        self.expected_at = None
        self.drain_deadline = None
        self.stopped = False
        self.exit_code = None
        self.exited_at = None
        self.lock = threading.Lock()
        self.epoch = 0
        self.first_answer = None  # (t, status)
        self.last_status = None
        self.last_status_t = None
        self.status_ok = 0
        self.status_failed = 0
        self.last_failure = ""
        self.stall = StallTracker(("starting", "joining", "") if kind in ("initial", "join", "restart-fresh") else ())
        self.rss = []  # (seconds since start, kB)
        self.rss_anon = []  # the same times, the anonymous pages alone
        self.stops = []  # [Unix time of SIGSTOP, of SIGCONT or None]
        self.verify = None
        self.finished = threading.Event()
        self.thread = None

    @property
    def label(self):
        return f"{self.node.name}#{self.index}"

    @property
    def alive(self):
        return self.exit_code is None

    def running(self):
        """Alive, answering, not stopped and not being ended by the script."""
        return self.alive and not self.stopped and self.expected is None and self.first_answer is not None

    def start(self, argv, env, nofile, log_mode="w"):
        # `ulimit -S -n` in a shell that then execs the daemon (no preexec_fn next to threads); with
        # `ip netns exec`, which execs too, the PID is the daemon's.
        wrapped = ["/bin/sh", "-c", f'ulimit -S -n {int(nofile)} && exec "$0" "$@"', *argv]
        if self.node.netns:
            wrapped = ["ip", "netns", "exec", self.node.netns, *wrapped]
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, log_mode) as log:
            log.write(f"# chaos: {' '.join(argv)}\n")
            log.flush()
            self.proc = subprocess.Popen(wrapped, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         env=env, start_new_session=True, close_fds=True)
        self.pid = self.proc.pid
        self.started = now()
        self.started_wall = time.time()

    def poll_exit(self):
        """Returns the exit status once the process has ended (negative: the signal), else None."""
        if self.exit_code is not None:
            return self.exit_code
        rc = self.proc.poll()
        if rc is not None:
            with self.lock:
                self.exit_code = rc
                self.exited_at = now()
                self.epoch += 1
                # An exit nobody asked for ends the open interval: the node ran until then.
                if self.expected is None and not self.stopped:
                    self.stall.close(self.exited_at, "process exited")
                else:
                    self.stall.since = None
            self.finished.set()
        return rc

    def signal(self, sig):
        try:
            os.kill(self.pid, sig)
            return True
        except ProcessLookupError:
            return False

    def end_counting(self, why):
        """The script is about to stop, kill or drain it: the stall clock stops here."""
        with self.lock:
            self.epoch += 1
            self.stall.close(now(), why)

    def start_polling(self, cli, interval):
        self.thread = threading.Thread(target=self._poll_loop, args=(cli, interval), daemon=True,
                                       name=f"poll-{self.label}")
        self.thread.start()

    def _poll_loop(self, cli, interval):
        while not self.finished.is_set():
            t0 = now()
            rss = read_rss_kb(self.pid)
            if rss is not None and self.exit_code is None:
                self.rss.append((t0 - self.started, rss[0]))
                self.rss_anon.append((t0 - self.started, rss[1]))
            with self.lock:
                epoch = self.epoch
                pollable = self.exit_code is None and not self.stopped and self.expected is None
            if pollable:
                status, why = cli.status(self.node.control, timeout=8)
                t1 = now()
                with self.lock:
                    if epoch == self.epoch and self.exit_code is None and not self.stopped and self.expected is None:
                        if status is not None:
                            self.status_ok += 1
                            self.last_status, self.last_status_t = status, t1
                            if self.first_answer is None:
                                self.first_answer = (t1, status)
                            self.stall.observe(t1, int(status.get("round", 0)), phase_name(status))
                        else:
                            self.status_failed += 1
                            self.last_failure = why
            self.finished.wait(max(0.05, interval - (now() - t0)))


def kill_all(instances):
    """SIGKILL to every process of ours still running (by PID, each the daemon we started)."""
    for inst in instances:
        if inst.proc is not None and inst.proc.poll() is None:
            try:
                os.kill(inst.pid, signal.SIGCONT)
                os.kill(inst.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    for inst in instances:
        if inst.proc is not None:
            try:
                inst.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
            inst.finished.set()
