"""Hostile probes against a running node.

flood: N TCP connections to its peer port that send only the HTTP/2 client preface and then hold
the connection open, saying nothing more; the node must keep answering `starling status`.

double_start: a second starlingd on the node's data dir, then one on its peer port and one on its
control port (each with everything else its own); each must exit non-zero at once, and the node
must go on answering.
"""

import errno
import resource
import socket
import subprocess
import time
from collections import Counter

from . import attacks, daemons


def raise_nofile(needed):
    """Raises this process's soft RLIMIT_NOFILE to `needed` (within the hard limit). Returns
    (original soft, new soft)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
    if want > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    return soft, max(soft, want)


def flood(cli, inst, host, port, connections, hold_s, result):
    """Runs on a thread of its own; fills `result`."""
    socks = []
    errors = Counter()
    fd_max = daemons.count_fds(inst.pid) or 0
    result.update(target=inst.label, address=f"{host}:{port}", connections=connections, hold_s=hold_s,
                  fds_before=fd_max)
    t0 = time.monotonic()
    for _ in range(connections):
        try:
            s = socket.create_connection((host, port), timeout=3)
            s.sendall(attacks.PREFACE)
            socks.append(s)
        except OSError as e:
            errors[errno.errorcode.get(e.errno, str(e)) if e.errno else type(e).__name__] += 1
    result["opened"] = len(socks)
    result["open_errors"] = dict(errors)
    result["open_seconds"] = round(time.monotonic() - t0, 2)
    # Hold, watching the node's descriptors; ask for its status halfway and at the end.
    answers = []

    def ask(when):
        # Only this process's answer counts: a node restarted meanwhile answers on the same address.
        running = daemons.pid_running(inst.pid)
        status, why = cli.status(inst.node.control, timeout=8)
        if not (running and daemons.pid_running(inst.pid)):
            status, why = None, f"process {inst.pid} has exited"
        answers.append((when, status is not None, why))

    deadline = t0 + hold_s
    mid_asked = False
    while time.monotonic() < deadline:
        n = daemons.count_fds(inst.pid)
        if n is not None:
            fd_max = max(fd_max, n)
        if not mid_asked and time.monotonic() >= t0 + hold_s / 2:
            mid_asked = True
            ask("halfway")
        time.sleep(0.5)
    ask("end of hold")
    for s in socks:
        s.setblocking(False)
    result["closed_by_node"] = sum(1 for s in socks if attacks.closed_by_peer(s))
    result["fds_max"] = fd_max
    for s in socks:
        try:
            s.close()
        except OSError:
            pass
    time.sleep(3)
    ask("3 s after closing")
    result["fds_after"] = daemons.count_fds(inst.pid)
    result["status"] = [{"when": w, "answered": ok, "error": e} for w, ok, e in answers]
    result["done"] = True


def double_start(starlingd, config, env, nofile, inst, work, free_port, result):
    """Runs on a thread of its own; fills `result["attempts"]`. free_port(host) gives a free port."""
    node = inst.node
    host = node.listen.rsplit(":", 1)[0]
    attempts = []
    cases = [
        ("same data dir", str(node.data_dir), f"{host}:{free_port(host)}", f"127.0.0.1:{free_port('127.0.0.1')}"),
        ("same peer port", str(work / "probe-peer"), node.listen, f"127.0.0.1:{free_port('127.0.0.1')}"),
    ]
    if not node.control.startswith("unix:"):
        cases.append(("same control port", str(work / "probe-control"), f"{host}:{free_port(host)}", node.control))
    for what, data_dir, listen, control in cases:
        argv = [str(starlingd), "--config", str(config), "--data-dir", data_dir, "--listen", listen, "--control",
                control, "--metrics", ""]
        log = work / "logs" / f"probe-{what.replace(' ', '-')}.log"
        t0 = time.monotonic()
        with open(log, "w") as out:
            p = subprocess.Popen(["/bin/sh", "-c", f'ulimit -S -n {int(nofile)} && exec "$0" "$@"', *argv],
                                 stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                 start_new_session=True)
        try:
            rc = p.wait(timeout=10)
            kept_running = False
        except subprocess.TimeoutExpired:
            kept_running = True
            p.kill()
            rc = p.wait()
        text = log.read_text(errors="replace")
        said = [l for l in text.splitlines() if l.startswith("error:")]
        attempts.append({"case": what, "exit": None if kept_running else rc, "kept_running": kept_running,
                         "seconds": round(time.monotonic() - t0, 2), "said": said[-1] if said else "",
                         "refused": (not kept_running) and rc != 0, "log": str(log)})
    status, why = daemons.Cli(result["starling"]).status(node.control, timeout=8)
    if not daemons.pid_running(inst.pid):
        status, why = None, f"process {inst.pid} has exited"
    result["target"] = inst.label
    result["attempts"] = attempts
    result["target_answers"] = status is not None
    result["target_error"] = why
    result["done"] = True
