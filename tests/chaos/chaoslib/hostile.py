"""The chaos suite's attack probes, each a check with its bound (tests/chaos/README.md):

- control rapid reset: two connections resetting streams as fast as they can on a node's Control
  port; its RSS stays under twice what it was, and SIGTERM in the middle of it ends the node
  (exit 0) within the drain bound;
- stranger frames: a rapid reset and 4 MiB request bodies on a node's peer port, each after a TLS
  handshake without the swarm's certificate; its RSS stays under twice what it was and it answers;
- join past an address flood: preface-only connections from 100 addresses (127.0.0.2-101), kept
  up as the node closes them, while a new node joins through that node alone; the joiner copies
  the swarm's state within the join bound;
- poisoned donor: a member whose learning rate is mistyped 1e2 (STARLING_OPTIMIZER_LR), then a
  new node whose only seed is that member; the joiner refuses its snapshot, naming its address,
  and copies an honest one whose training loss is finite. In DiLoCo the member's phi is the
  swarm's (its D's are left out), so its snapshot is honest and taken.

Each probe is a small state machine the run's main loop drives: start() when it is due (False:
no node can be its target now, try again later), poll() every loop until it returns True, then
finish(), which sets result["ok"] and result["summary"] (the table's row)."""

import math
import re
import threading
import time

from . import attacks, daemons, logs
from .daemons import now

STRANGER_SOURCES = ("127.0.0.200", "127.0.0.201")  # no member's address


def rss_bounded(usage):
    return bool(usage["rss_before_kb"]) and usage["rss_peak_kb"] <= 2 * usage["rss_before_kb"]


def usage_text(usage):
    return (f"RSS {usage['rss_before_kb'] // 1024} -> {usage['rss_peak_kb'] // 1024} MiB (bound 2x), threads "
            f"{usage['threads_before']} -> {usage['threads_peak']}")


def ask_status(chaos, inst, timeout=8):
    """(answered, seconds, why) for one `starling status` of this process."""
    t = now()
    status, why = chaos.cli.status(inst.node.control, timeout=timeout)
    if not daemons.pid_running(inst.pid):
        status, why = None, f"process {inst.pid} has exited"
    return status is not None, round(now() - t, 2), why


class Probe:
    name = ""

    def __init__(self, due_fraction, hold_s):
        self.due_fraction = due_fraction
        self.hold_s = hold_s
        self.result = {"skipped": "not run"}
        self.started = False
        self.done = False

    def pick_target(self, chaos):
        eligible = chaos.reachable_eligible()
        if not eligible:
            return None
        inst = chaos.rng.choice(eligible)
        inst.node.busy_until = math.inf
        return inst

    def begin(self, chaos, address_of, sample_usage=True):
        """Takes a target (self.inst) and its address (address_of(node), HOST:PORT), samples its
        usage from now (self.usage) and starts the result; (host, port), or None when no node can be
        the target now."""
        inst = self.pick_target(chaos)
        if inst is None:
            return None
        self.inst = inst
        address = address_of(inst.node)
        host, port = address.rsplit(":", 1)
        self.usage = attacks.Usage(inst.pid).start() if sample_usage else None
        self.t0 = now()
        self.result = {"target": inst.label, "address": address, "started_s": round(chaos.t(), 1)}
        return host, int(port)

    def release(self, inst):
        inst.node.busy_until = now() + 5

    @property
    def verdict(self):
        if self.result.get("skipped"):
            return "-"
        return "ok" if self.result.get("ok") else "FAIL"


class ControlRapidReset(Probe):
    name = "control rapid reset"

    def start(self, chaos):
        address = self.begin(chaos, lambda node: node.control)
        if address is None:
            return False
        self.attack = attacks.Attack("rapid_reset", *address, attacks.CONTROL_STATUS, workers=2).start()
        self.term_at = None
        self.during = None
        self.asker = threading.Thread(target=self._ask_during, args=(chaos,), daemon=True)
        self.asker.start()
        chaos.note(f"control rapid reset on {self.inst.label} ({self.result['address']}): 2 connections for "
                   f"{self.hold_s:.0f} s, then SIGTERM while it goes on")
        return True

    def _ask_during(self, chaos):
        time.sleep(self.hold_s / 2)
        self.during = ask_status(chaos, self.inst, timeout=15)

    def poll(self, chaos):
        inst = self.inst
        if self.term_at is None:
            if now() - self.t0 < self.hold_s:
                return False
            self.term_at = now()
            chaos.term(inst, "control rapid reset")
            return False
        return not inst.alive or now() > self.term_at + chaos.drain_bound() + 5

    def finish(self, chaos):
        inst = self.inst
        self.attack.stop()
        self.usage.stop()
        self.asker.join(timeout=20)
        self.release(inst)
        usage = self.usage.figures()
        drained = inst.exit_code == 0 and inst.exited_at is not None
        drain_s = round(inst.exited_at - self.term_at, 1) if drained else None
        answered, secs, why = self.during or (False, None, "not asked")
        self.result.update(usage=usage, attack=self.attack.figures(), status_during={"answered": answered,
                           "seconds": secs, "error": why}, exit=inst.exit_code, drain_s=drain_s,
                           drain_bound_s=round(chaos.drain_bound(), 1))
        self.result["ok"] = rss_bounded(usage) and answered and drained and drain_s <= chaos.drain_bound()
        a = self.result["attack"]
        self.result["summary"] = (
            f"{inst.label}: {a['streams']} streams reset on {a['connections']} connections, "
            f"{a['ended'].get('closed by node', 0)} closed by node; {usage_text(usage)}; status during it "
            + (f"in {secs:.1f} s" if answered else f"FAILED ({why})")
            + "; SIGTERM during it: " + (f"exit 0 in {drain_s:.1f} s" if drained else f"exit {inst.exit_code}")
            + f" / bound {chaos.drain_bound():.0f} s")


class StrangerFrames(Probe):
    name = "stranger frames (peer)"

    def start(self, chaos):
        address = self.begin(chaos, lambda node: node.listen)
        if address is None:
            return False
        self.attacks = [
            attacks.Attack("rapid_reset", *address, attacks.PEER_JOIN, workers=2, source=STRANGER_SOURCES[0],
                           tls=True).start(),
            attacks.Attack("large_bodies", *address, attacks.PEER_JOIN, workers=1, source=STRANGER_SOURCES[1],
                           tls=True).start(),
        ]
        chaos.note(f"stranger frames on {self.inst.label} ({self.result['address']}): rapid reset and 4 MiB bodies "
                   f"after a TLS handshake without the swarm's certificate, {self.hold_s:.0f} s")
        return True

    def poll(self, chaos):
        return now() - self.t0 >= self.hold_s or not self.inst.alive

    def finish(self, chaos):
        inst = self.inst
        for a in self.attacks:
            a.stop()
        self.usage.stop()
        answered, secs, why = ask_status(chaos, inst)
        self.release(inst)
        usage = self.usage.figures()
        reset, bodies = (a.figures() for a in self.attacks)
        self.result.update(usage=usage, rapid_reset=reset, large_bodies=bodies, alive=inst.alive,
                           status_after={"answered": answered, "seconds": secs, "error": why})
        self.result["ok"] = rss_bounded(usage) and inst.alive and answered
        self.result["summary"] = (
            f"{inst.label}: {reset['connections'] + bodies['connections']} TLS connections, "
            f"{reset['streams']} streams reset, {bodies['bytes'] / 1e6:.0f} MB of bodies sent; {usage_text(usage)}; "
            + ("answers after" if answered else f"status FAILED ({why})"))


class JoinPastAddressFlood(Probe):
    name = "join past an address flood"

    def __init__(self, due_fraction, hold_s, connections, sources):
        super().__init__(due_fraction, hold_s)
        self.connections, self.sources = connections, sources

    def start(self, chaos):
        address = self.begin(chaos, lambda node: node.listen, sample_usage=False)
        if address is None:
            return False
        self.flood = attacks.PrefaceFlood(*address, self.connections,
                                          [f"127.0.0.{2 + k}" for k in range(self.sources)]).start()
        self.joiner = None
        chaos.note(f"address flood on {self.inst.label} ({self.result['address']}): {self.connections} preface "
                   f"connections from {self.sources} addresses, reopened as they close; a new node joins through it "
                   f"alone")
        return True

    def poll(self, chaos):
        if self.joiner is None:
            if not self.flood.opened.is_set():
                return now() - self.t0 > 60
            self.joiner = chaos.join_new_node([self.inst.node.listen], "join past an address flood", make_room=False)
            return False
        v = self.joiner.verify
        return v["result"] is not None

    def finish(self, chaos):
        self.flood.stop()
        self.release(self.inst)
        f = self.flood.figures()
        self.result.update(flood=f, alive=self.inst.alive)
        if self.joiner is None:
            self.result["ok"] = False
            self.result["summary"] = f"{self.inst.label}: the flood did not open its connections within 60 s"
            return
        v = self.joiner.verify
        self.result.update(joiner=self.joiner.label, joined=v["result"], join_s=v.get("seconds"),
                           join_detail=v.get("detail"))
        self.result["ok"] = bool(v["result"]) and self.inst.alive
        self.result["summary"] = (
            f"{self.inst.label}: {f['opened']} connections from {f['sources']} addresses ({f['reopened']} reopened); "
            f"joiner {self.joiner.label} " + (f"in after {v['seconds']:.1f} s" if v["result"] else "NOT in")
            + f" / bound {chaos.join_bound():.0f} s")


class PoisonedDonor(Probe):
    """After the joiner is judged the poisoned member stays among the others until a node has
    quarantined it, at most hold_s: pairing is random, and a node quarantines a member once it has
    refused two of its messages in a row, so how soon one does is luck. The check is that every
    process whose log refused two in a row quarantined it, and that one did when any refused two."""
    name = "poisoned donor"
    ROUNDS_TO_DIVERGE = 3
    LOOK_EVERY_S = 2.0  # how often the logs are read for a quarantine while it stays

    def start(self, chaos):
        node = chaos.new_node("p0", role="poisoned")
        node.env = {"STARLING_OPTIMIZER_LR": "1e2"}  # a restart after a crash keeps it
        self.poisoned = chaos.start(node, "initial", chaos.seeds_for(node))
        self.first_round = None
        self.joiner = None
        self.joined_at = None
        self.judged_at = None
        self.looked_at = 0.0
        self.t0 = now()
        self.result = {"poisoned": self.poisoned.label, "address": node.listen, "started_s": round(chaos.t(), 1)}
        chaos.note(f"poisoned donor {self.poisoned.label} ({node.listen}) with a learning rate of 1e2; once it has "
                   f"trained {self.ROUNDS_TO_DIVERGE} rounds a new node joins through it alone; it stays among the "
                   f"others until one quarantines it, at most {self.hold_s:.0f} s")
        return True

    def poll(self, chaos):
        p = self.poisoned
        if not p.alive:
            return True
        if self.result.get("node_id") is None:
            self.result["node_id"] = (p.last_status or {}).get("node_id")
        if self.joiner is None:
            st = p.last_status or {}
            if daemons.phase_name(st) in ("training", "exchanging", "waiting") and self.first_round is None:
                self.first_round = int(st.get("round", 0))
            # Rounds trained since its last state copy: one that fell behind copies an honest
            # snapshot and publishes that until it has trained on it.
            copies = logs.JOINED.findall(p.log_path.read_text(errors="replace")) if self.first_round is not None else []
            base = max([self.first_round or 0] + [int(c) for c in copies])
            if self.first_round is not None and int(st.get("round", 0)) >= base + self.ROUNDS_TO_DIVERGE:
                self.joiner = chaos.join_new_node([p.node.listen], "join through a poisoned donor", make_room=False)
                # No action may take the joiner before it has trained on what it copied (one retired
                # it to make room for another joiner 4 s after it joined).
                self.joiner.node.busy_until = math.inf
                return False
            return now() - self.t0 > 120
        if self.joiner.verify["result"] is None:
            return False
        # Judge a round the joiner trained on what it copied, then leave the poisoned member among the
        # others until one quarantines it, at most hold_s.
        if self.joined_at is None:
            self.joined_at = now()
        if self.judged_at is None:
            st = self.joiner.last_status or {}
            if st.get("train_loss") is not None or now() - self.joined_at > 30 or not self.joiner.alive:
                self.judged_at = now()
                self.joiner_train_loss = st.get("train_loss")
                self.release(self.joiner)
            return False
        if now() - self.judged_at >= self.hold_s:
            return True
        if now() - self.looked_at < self.LOOK_EVERY_S:
            return False
        self.looked_at = now()
        return bool(self.quarantined_by(chaos))

    def others(self, chaos):
        """The log text of every process of another node that has run, by label."""
        return {i.label: i.log_path.read_text(errors="replace") for i in chaos.instances
                if i is not self.poisoned and i.started_wall is not None and i.log_path.exists()}

    def quarantined_by(self, chaos):
        return sorted(label for label, text in self.others(chaos).items()
                      if logs.quarantines_of(text, self.poisoned.node.listen))

    def finish(self, chaos):
        p = self.poisoned
        self.result["poisoned_train_loss"] = (p.last_status or {}).get("train_loss")
        if p.alive:
            chaos.retire(p)
        if self.joiner is None:
            self.result["ok"] = False
            self.result["summary"] = f"{p.label}: no joiner started (poisoned member alive: {p.alive})"
            return
        self.release(self.joiner)
        text = self.joiner.log_path.read_text(errors="replace")
        refusals = logs.refusals_of(text, p.node.listen)
        loss = getattr(self, "joiner_train_loss", None)
        v = self.joiner.verify
        # A process logs the quarantine before the round line of the refusal that set it off, so
        # every run of two its log shows has its quarantine line there too.
        texts = self.others(chaos)
        quarantined_by = self.quarantined_by(chaos)
        node_id = self.result.get("node_id")
        refused_twice = sorted(label for label, text in texts.items()
                               if node_id and logs.longest_refusal_run(text, node_id) >= 2)
        not_quarantined = [label for label in refused_twice if label not in quarantined_by]
        self.result.update(joiner=self.joiner.label, joined=v["result"], join_detail=v.get("detail"),
                           refusals=refusals[:3], joiner_train_loss=loss, quarantined_by=quarantined_by,
                           refused_twice=refused_twice, refused_twice_not_quarantined=not_quarantined)
        finite = isinstance(loss, (int, float)) and math.isfinite(loss) and loss < 5.0  # ln 256 = 5.55 untrained
        # DiLoCo's phi is every member's: the member's own D's are left out, and its snapshot is
        # the swarm's, which a joiner is right to take.
        poisoned_snapshot = chaos.settings.method != "diloco"
        self.result["ok"] = (bool(v["result"]) and (bool(refusals) or not poisoned_snapshot) and finite
                             and not not_quarantined)
        self.result["summary"] = (
            f"{p.label} (train loss {fmt_loss(self.result['poisoned_train_loss'])}): joiner {self.joiner.label} "
            + (f"refused its snapshot ({refusal_reason(refusals[0])})" if refusals else
               "did NOT refuse its snapshot" if poisoned_snapshot else "took its snapshot (DiLoCo: the swarm's phi)")
            + (f", joined in {v['seconds']:.1f} s" if v["result"] else ", did NOT join")
            + f", then train loss {fmt_loss(loss)}; quarantined by "
            + (", ".join(quarantined_by) if quarantined_by else "no node")
            + (f"; NOT by {', '.join(not_quarantined)}, which refused two of its messages in a row"
               if not_quarantined else "" if refused_twice or quarantined_by else
               f" (none refused two of its messages in a row within {self.hold_s:.0f} s)"))


def refusal_reason(line):
    """The norms a refusal compared, or the start of its reason."""
    why = line.split(" refused: ", 1)[1]
    m = re.search(r"phi's norm (\S+) .* the median ([0-9.e+-]+)", why)
    return f"phi's norm {m.group(1)}, the median {m.group(2)}" if m else why[:90]


def fmt_loss(x):
    return f"{x:.4g}" if isinstance(x, (int, float)) else str(x) if x else "-"


class FlippingMember(Probe):
    """A member f0 (never an action's target) whose training is honest but whose messages are
    sign-flipped: faulty_starlingd --fault sign_flip, the test binary beside starlingd in --bin.
    After hold_s among the others it leaves for good. Reported, not checked: how many of its
    messages the others took and refused, and who quarantined it. Under the suite's load rounds
    switch to token budgets, where NoLoCo's held-out check judges only a partner claiming at least
    the node's tokens, and most flipped messages were taken (docs/security.md); a crash of f0
    still fails the crashes check."""
    name = "flipping member"

    def start(self, chaos):
        binary = chaos.bin / "faulty_starlingd"
        if not binary.exists():
            self.result = {"skipped": f"no {binary} (a test binary of the build tree)"}
            self.done = True  # started and done at once: nothing to drive
            return True
        node = chaos.new_node("f0", role="faulty")
        node.command = [str(binary), "--fault", "sign_flip"]
        self.faulty = chaos.start(node, "initial", chaos.seeds_for(node))
        self.t0 = now()
        self.result = {"faulty": self.faulty.label, "address": node.listen, "started_s": round(chaos.t(), 1)}
        chaos.note(f"flipping member {self.faulty.label} ({node.listen}): its messages sign-flipped, among the "
                   f"others for {self.hold_s:.0f} s")
        return True

    def poll(self, chaos):
        if self.result.get("node_id") is None:
            self.result["node_id"] = (self.faulty.last_status or {}).get("node_id")
        return not self.faulty.alive or now() - self.t0 >= self.hold_s

    def finish(self, chaos):
        f = self.faulty
        if f.alive:
            chaos.retire(f)
        others = [i for i in chaos.instances
                  if i.node is not f.node and i.started_wall is not None and i.log_path.exists()]
        texts = {i.label: i.log_path.read_text(errors="replace") for i in others}
        quarantined_by = sorted(label for label, text in texts.items() if logs.quarantines_of(text, f.node.listen))
        messages = logs.partner_messages(texts.values(), self.result.get("node_id"))
        scores = sorted(messages.taken_scores)
        self.result.update(taken=messages.taken, refused=messages.refused, taken_scores=scores,
                           taken_unscored=messages.taken_unscored, left_out=messages.left_out,
                           quarantined_by=quarantined_by)
        # Why the taken ones passed: the held-out scores they had, or none for claiming fewer tokens.
        why_taken = (f" (held-out {', '.join(f'{x:.3f}' for x in scores) or 'none'} of the node's own; "
                     f"{messages.taken_unscored} not scored)") if messages.taken else ""
        judged = (f"its D left out {messages.left_out} times" if chaos.settings.method == "diloco" else
                  f"its messages taken {messages.taken} times{why_taken}, refused {messages.refused}")
        self.result["summary"] = (f"{f.label}: {judged}; quarantined by "
                                  + (", ".join(quarantined_by) if quarantined_by else "no node"))

    @property
    def verdict(self):
        return "-" if self.result.get("skipped") else "info"


def default_probes(args):
    """The attack probes of a run, due at these fractions of the chaos phase (the preface flood is
    due at 0.35 and the double start at 0.15)."""
    hold = min(30.0, max(8.0, 0.01 * args.duration))
    return [ControlRapidReset(0.22, hold), PoisonedDonor(0.28, 6 * hold), FlippingMember(0.4, 3 * hold),
            StrangerFrames(0.5, hold), JoinPastAddressFlood(0.6, 0, args.address_flood_connections, 100)]

