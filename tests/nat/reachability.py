#!/usr/bin/env python3
"""Reachability behind real NAT: starlingd processes in network namespaces (tests/chaos/chaoslib/nat.py).

Two public nodes in the internet's namespace (a node can only ask members it can call, so a public one
needs another public one to learn it is public), one node behind a masquerading router and one
behind a firewall that drops inbound connections, each announcing the address it listens on, as an operator
who knows no better would. Each node must learn within a round whether members can dial it, say so
in `starling status` and its log (a hidden one at warn, with what to do), and the seed's
`starling peers` must show the hidden ones as private. Then `starling check` from behind the NAT
(the node stopped) warns, and from a public address says ok.

With --method diloco the swarm runs DiLoCo instead, and every member's D must enter every
member's mean: the hidden nodes deposit theirs with their anchors (peer/round_deposits.h), since
nobody can fetch it from them.

With --relay there are four hidden nodes (two behind NATs, two behind firewalls) beside the two
public ones, so the rounds' matching leaves two hidden nodes to pair with each other: neither can
dial the other, and with hole punching off their exchange must go through a public node's relay
(peer/exchange_relay.h) and arrive whole. With --punch the same swarm keeps hole punching on: two
hidden nodes paired with each other must connect directly through their routers
(peer/hole_punch.h) and exchange over that connection, and the hidden nodes' punches are counted.
With --punch-fails the four hidden nodes sit behind symmetric NATs (a fresh port per connection),
through which no punch connects: the hidden pairs must exchange through a relay, and a node must
not try a punch again to a partner it failed to (at most one failed punch per hidden partner).

Exit 0 on success, 1 on a failed check, 77 (ctest's skip) without root, `ip` or `nft`.
"""

import argparse
import json
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "chaos"))

from chaoslib import config as cfgmod  # noqa: E402
from chaoslib import nat  # noqa: E402

SKIP = 77
VERDICT_WITHIN_S = 60


class Failure(Exception):
    pass


def say(msg):
    print(msg, flush=True)


class Daemon:
    def __init__(self, name, work, listen, netns=None):
        self.name = name
        self.listen = listen
        self.netns = netns
        self.data_dir = work / name
        self.control = f"unix:{work / (name + '.sock')}"
        self.log = work / f"{name}.log"
        self.proc = None

    def wrap(self, argv):
        return ["ip", "netns", "exec", self.netns, *argv] if self.netns else argv

    def start(self, starlingd, config, seeds, env):
        argv = [str(starlingd), "--config", str(config), "--data-dir", str(self.data_dir), "--listen",
                self.listen, "--announce", self.listen, "--control", self.control, "--metrics", ""]
        for s in seeds:
            argv += ["--seed", s]
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen(self.wrap(argv), stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, env=env, start_new_session=True)

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def cli(self, starling, *args, env):
        p = subprocess.run([str(starling), "--control", self.control, *args], capture_output=True,
                           text=True, timeout=15, env=env, stdin=subprocess.DEVNULL)
        return p.returncode, p.stdout + p.stderr

    def status(self, starling, env):
        rc, out = self.cli(starling, "status", "--json", env=env)
        return json.loads(out) if rc == 0 else None


def wait_for(what, limit_s, probe):
    deadline = time.monotonic() + limit_s
    last = None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(0.5)
    raise Failure(f"{what}: not within {limit_s} s")


def check_line(output, name):
    """The line `starling check` printed for one check ("warn  reachable: ..."), with its fix line."""
    lines = output.splitlines()
    for i, ln in enumerate(lines):
        words = ln.split()
        if len(words) > 1 and words[1] == name + ":":
            return "\n".join(lines[i:i + 2])
    return ""


def check(condition, what):
    if not condition:
        raise Failure(what)
    say(f"ok: {what}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bin", required=True, help="directory of starlingd and starling")
    ap.add_argument("--method", choices=("noloco", "diloco"), default="noloco")
    paths = ap.add_mutually_exclusive_group()
    paths.add_argument("--relay", action="store_true",
                       help="four hidden nodes, two of which must exchange through a relay")
    paths.add_argument("--punch", action="store_true",
                       help="four hidden nodes, two of which must exchange over a punched connection")
    paths.add_argument("--punch-fails", action="store_true",
                       help="four hidden nodes behind symmetric NATs, whose pairs fall back to relays")
    args = ap.parse_args()
    pair_hidden = args.relay or args.punch or args.punch_fails
    why = nat.why_unavailable()
    if why:
        say(f"skipped: {why}")
        return SKIP
    bin_dir = Path(args.bin).resolve()
    starlingd, starling = bin_dir / "starlingd", bin_dir / "starling"
    work = Path(tempfile.mkdtemp(prefix="starling-nat-"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("STARLING_")}
    env["STARLING_PEER_SECRET"] = "nat-" + secrets.token_hex(16)
    data = work / "kjv"
    subprocess.run([str(starling), "data", "prepare", "--out", str(data)], check=True,
                   capture_output=True, env=env)
    overrides = cfgmod.chaos_overrides(data, 10_000_000)
    overrides["peer"]["swarm_id"] = "nat"
    overrides["swarm"]["method"] = args.method
    overrides["peer"]["hole_punch"] = not args.relay
    config = work / "node.toml"
    config.write_text(cfgmod.derive((REPO / "configs" / "pico.toml").read_text(), overrides))

    kinds = ["symmetric"] * 4 if args.punch_fails else ["nat", "firewall"] * (2 if pair_hidden else 1)
    topo = nat.NatTopology(kinds)
    daemons = []
    try:
        topo.setup()
        say(topo.describe())
        behind_nat = topo.hidden[0]
        seed = Daemon("seed", work, f"{topo.public_ip}:7700", topo.public_ns)
        public = Daemon("public", work, f"{topo.public_ip}:7701", topo.public_ns)
        names = (["sym0", "sym1", "sym2", "sym3"] if args.punch_fails
                 else ["natted", "walled", "natted2", "walled2"])
        hidden = [Daemon(name, work, f"{h.ip}:7700", h.ns) for name, h in zip(names, topo.hidden)]
        for d, h in zip(hidden, topo.hidden):
            d.router_kind = h.kind
        natted, walled = hidden[:2]
        daemons = [seed, public, *hidden]
        seed.start(starlingd, config, [], env)
        for d in (public, *hidden):
            d.start(starlingd, config, [seed.listen], env)

        seen = {}

        def verdicts():
            for d in daemons:
                s = d.status(starling, env)
                seen[d.name] = "no status" if s is None else s.get("reachability", "unknown")
                if s is None or seen[d.name] == "unknown":
                    return None
                got[d.name] = s
            return got

        got = {}
        start = time.monotonic()
        try:
            wait_for("every node's reachability verdict", VERDICT_WITHIN_S, verdicts)
        except Failure as e:
            raise Failure(f"{e} (last seen: {seen})")
        say(f"verdicts after {time.monotonic() - start:.1f} s: " +
            ", ".join(f"{n}: {s['reachability']}" for n, s in got.items()))
        check(got["seed"]["reachability"] == "public", "the public seed is public")
        check(got["public"]["reachability"] == "public", "the other public node is public")
        for d in hidden:
            check(got[d.name]["reachability"] == "private", f"{d.name}, behind a {d.router_kind} router, is private")
        detail = got[natted.name].get("reachability_detail", "")
        check(behind_nat.router_public_ip in detail and "behind NAT" in detail,
              f"the NATed node's detail names the address members see it from: {detail}")
        if not args.punch_fails:
            detail = got["walled"].get("reachability_detail", "")
            check(walled.listen in detail and "Open TCP port 7700" in detail,
                  f"the firewalled node's detail says to open its port: {detail}")
        for d in hidden:
            warned = [ln for ln in d.log.read_text().splitlines()
                      if " warning " in ln and "peer: unreachable:" in ln]
            check(len(warned) >= 1, f"{d.name} warns that it is unreachable in its log: {warned[:1]}")

        def seed_sees_private():
            rc, out = seed.cli(starling, "peers", "--json", env=env)
            if rc != 0:
                return None
            peers = {p.get("address"): p.get("reachability") for p in json.loads(out).get("peers", [])}
            return peers if all(peers.get(d.listen) == "private" for d in hidden) else None

        wait_for("the seed's peers showing every hidden node private", 30, seed_sees_private)
        say("ok: the seed's `starling peers` shows every hidden node private")

        # Anchors: each hidden node holds a stream to both public nodes, names them in its digest,
        # and is probed through them rather than suspected at every probe.
        ids = {d.name: got[d.name]["node_id"] for d in daemons}
        public_ids = sorted([ids["seed"], ids["public"]])

        def anchored():
            for d in hidden:
                s = d.status(starling, env)
                if s is None or sorted(s.get("anchors", [])) != public_ids:
                    return None
            held = [int((d.status(starling, env) or {}).get("anchored_members", 0)) for d in (seed, public)]
            return held if held == [len(hidden)] * 2 else None

        wait_for("every hidden node anchored at both public nodes", 30, anchored)
        say(f"ok: every hidden node holds streams to both public nodes, which anchor {len(hidden)} members each")
        def seed_names_anchors():
            rc, out = seed.cli(starling, "peers", "--json", env=env)
            if rc != 0:
                return None
            listed = {p.get("node_id"): sorted(p.get("anchors", [])) for p in json.loads(out).get("peers", [])}
            return listed if all(listed.get(ids[d.name]) == public_ids for d in hidden) else None

        wait_for("the seed's peers naming each hidden node's anchors", 30, seed_names_anchors)
        say("ok: the seed's `starling peers` names each hidden node's anchors")

        def suspicions():
            # "peer: node ID at ADDRESS does not answer; suspect", in the public nodes' logs
            counts = {d.name: 0 for d in daemons}
            for observer in (seed, public):
                for ln in observer.log.read_text().splitlines():
                    if "does not answer; suspect" in ln:
                        for d in daemons:
                            if ids[d.name] in ln:
                                counts[d.name] += 1
            return counts

        suspected_before = suspicions()

        if args.method == "diloco":
            # A quorum of 4: the hidden nodes' D's, which only their anchors can serve, entered
            # every member's mean in the same round.
            def all_four_gathered():
                quorums = {d.name: int((d.status(starling, env) or {}).get("last_quorum", 0))
                           for d in daemons}
                return quorums if all(q == 4 for q in quorums.values()) else None

            quorums = wait_for("a round whose mean took all four D's at every member", 90,
                               all_four_gathered)
            say(f"ok: every member's last round took all four D's: {quorums}")
            return 0

        hidden_ids = {ids[d.name]: d.name for d in hidden}

        def hidden_pairs():
            """Each round a hidden node logged with another hidden node as its partner and the
            partner's message received: (the node, the partner's name, the bytes received)."""
            for d in hidden:
                for ln in d.log.read_text().splitlines():
                    if " | partner " not in ln or "solo:" in ln:
                        continue
                    partner = ln.split(" | partner ")[1].split(" ")[0]
                    received = int(ln.split("received ")[1].split(" B")[0])
                    if partner in hidden_ids and received > 0:
                        yield d, hidden_ids[partner], received

        if args.relay:
            # Two hidden nodes paired with each other, and a public node counts the relay.
            def relayed():
                for d, partner, received in hidden_pairs():
                    relays = {r.name: int((r.status(starling, env) or {}).get("relayed_exchanges", 0))
                              for r in (seed, public)}
                    through = int((d.status(starling, env) or {}).get("exchanges_through_relay", 0))
                    if sum(relays.values()) > 0 and through > 0:
                        return d.name, partner, received, relays, through
                return None

            who, partner, received, relays, through = wait_for(
                "an exchange between two hidden nodes through a relay", 120, relayed)
            say(f"ok: {who} exchanged with {partner} through a relay ({received} bytes received); "
                f"relayed exchanges by the public nodes: {relays}; {who}'s through a relay: {through}")
            return 0

        if args.punch:
            # Two hidden nodes paired with each other, one of which counts an exchange over a
            # punched connection.
            def punched():
                for d, partner, received in hidden_pairs():
                    s = d.status(starling, env) or {}
                    if int(s.get("punched_exchanges", 0)) > 0:
                        return d.name, partner, received, s
                return None

            who, partner, received, s = wait_for(
                "an exchange between two hidden nodes over a punched connection", 120, punched)
            say(f"ok: {who} exchanged with {partner} over a punched connection ({received} bytes "
                f"received); its punches: {s.get('hole_punches', 0)} connected, "
                f"{s.get('failed_hole_punches', 0)} failed, {s.get('punched_exchanges', 0)} "
                f"exchanges over them, {s.get('exchanges_through_relay', 0)} through a relay")
            counts = {d.name: {k: int((d.status(starling, env) or {}).get(k, 0))
                               for k in ("hole_punches", "failed_hole_punches", "punched_exchanges",
                                         "exchanges_through_relay")}
                      for d in hidden}
            say(f"hidden nodes' punches: {counts}")
            return 0

        if args.punch_fails:
            # A hidden node's punch to a hidden partner fails, and it exchanges with that partner
            # again, through a relay, with no second punch: each failure and each round is a line
            # of its log, in order.
            def punches_and_rounds(d):
                """Per hidden partner's name: the failed punches to it, and the exchanges with it
                after the first of them (the first of which is the failed punch's own)."""
                failed, after = {}, {}
                for ln in d.log.read_text().splitlines():
                    if "no direct connection to node " in ln:
                        partner = ln.split("no direct connection to node ")[1].split(",")[0]
                        if partner in hidden_ids:
                            failed[hidden_ids[partner]] = failed.get(hidden_ids[partner], 0) + 1
                    elif " | partner " in ln and "solo:" not in ln:
                        partner = hidden_ids.get(ln.split(" | partner ")[1].split(" ")[0])
                        if partner in failed and int(ln.split("received ")[1].split(" B")[0]) > 0:
                            after[partner] = after.get(partner, 0) + 1
                return failed, after

            def met_again():
                for d in hidden:
                    failed, after = punches_and_rounds(d)
                    if any(times >= 2 for times in after.values()):
                        return d, failed, after
                return None

            d, failed, after = wait_for(
                "a hidden node that exchanged again with a hidden partner its punch failed to", 240,
                met_again)
            s = d.status(starling, env) or {}
            punches = {k: int(s.get(k, 0)) for k in ("hole_punches", "failed_hole_punches",
                                                     "punched_exchanges", "exchanges_through_relay")}
            say(f"{d.name}'s failed punches by hidden partner: {failed}; its exchanges with them after "
                f"the failure: {after}; its counts: {punches}")
            check(punches["hole_punches"] == 0 and punches["punched_exchanges"] == 0,
                  "no punch connects through two symmetric NATs")
            check(punches["exchanges_through_relay"] >= 2, "the exchanges went through a relay")
            check(all(failed[p] == 1 for p, times in after.items() if times >= 2),
                  "no second punch to a partner whose punch failed")
            say("ok: the hidden pairs exchanged through relays after one failed punch per partner")
            return 0

        # Connection reversal: a hidden node proposes itself and opens the exchange, so it pairs
        # with a public partner although nobody can dial it.
        def natted_paired():
            s = natted.status(starling, env)
            return s if s and int(s.get("rounds_paired", 0)) > 0 and int(s.get("bytes_received", 0)) > 0 else None

        s = wait_for("a paired round with an exchange on the node behind NAT", 90, natted_paired)
        say(f"ok: the node behind NAT paired and exchanged: {s['rounds_paired']} paired, {s['rounds_solo']} solo, "
            f"{s['bytes_received']} bytes received")
        after = suspicions()
        raised = {n: after[n] - suspected_before[n] for n in after}
        say(f"suspicions by the public nodes since the anchors were held: {raised}")
        # A busy machine may delay any probe; a hidden node is no more suspect than a public one.
        check(max(raised["natted"], raised["walled"]) <= raised["public"] + raised["seed"] + 1,
              "the hidden nodes are suspected no more often than the public ones")

        natted.stop()
        p = subprocess.run(natted.wrap([str(starling), "check", "--config", str(config), "--data-dir",
                                        str(natted.data_dir), "--listen", natted.listen, "--announce",
                                        natted.listen, "--seed", seed.listen]),
                           capture_output=True, text=True, env=env, timeout=60)
        line = check_line(p.stdout, "reachable")
        check(line.startswith("warn") and behind_nat.router_public_ip in line and "fix:" in line,
              f"`starling check` behind the NAT warns, naming the address the seed sees: {line}")
        fresh = f"{topo.public_ip}:7711"
        p = subprocess.run(seed.wrap([str(starling), "check", "--config", str(config), "--data-dir",
                                      str(work / "fresh"), "--listen", fresh, "--announce", fresh,
                                      "--seed", seed.listen]),
                           capture_output=True, text=True, env=env, timeout=60)
        line = check_line(p.stdout, "reachable")
        check(line.startswith("ok"), f"`starling check` at a public address says ok: {line}")
        return 0
    except (Failure, RuntimeError, subprocess.CalledProcessError) as e:
        say(f"FAIL: {e}")
        say(f"the daemons' logs and data are kept in {work}")
        for d in daemons:
            if d.log.exists():
                say(f"--- {d.name}'s log, last lines:")
                say("\n".join(d.log.read_text().splitlines()[-15:]))
        return 1
    finally:
        for d in daemons:
            d.stop()
        topo.cleanup()


if __name__ == "__main__":
    sys.exit(main())
