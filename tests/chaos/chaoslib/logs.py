"""Reading starlingd's log lines (spdlog: `[YYYY-mm-dd HH:MM:SS.mmm +HH:MM] level message`).

The lines read are the ones daemon/swarm/swarm_node.cpp and daemon/service/node_runner.cpp write:
  swarm: node ID round R | loss L | partner P|none | sent S B, received R B | pair X s, exchange Y s
    [ | landed N steps on, waited W s] (overlap) [ | solo: WHY]
  swarm: node ID round R | loss L | local
  round R: validation loss of the averaged weights L
  resumed from checkpoint PATH (round R, inner step S)
  swarm: node ID joined at round R (inner step S) from a snapshot of N bytes
"""

import calendar
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

LINE = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)\.(\d{3}) ([+-]\d\d:\d\d)\] (\w+) (.*)$")
NOLOCO_ROUND = re.compile(
    r"swarm: node ([0-9a-f]+) round (\d+) \| loss (\S+) \| partner (\S+) \| sent (\d+) B, received (\d+) B"
    r" \| pair ([\d.]+) s, exchange ([\d.]+) s(?: \| held-out [^|]*)?(?: \| landed \d+ steps on, waited [\d.]+ s)?(?: \| solo: (.*))?$"
)
LOCAL_ROUND = re.compile(r"swarm: node ([0-9a-f]+) round (\d+) \| loss (\S+) \| local$")
VAL = re.compile(r"^round (\d+): validation loss of the averaged weights ([\d.]+|nan|inf)")
RESUMED = re.compile(r"resumed from checkpoint (\S+) \(round (\d+)")
JOINED = re.compile(r"swarm: node [0-9a-f]+ joined at round (\d+)")
COPY_FAILED = re.compile(r"copying the state failed")
DONOR_DROPPED = re.compile(r"state sync: dropping donor (\S+): (.*)$")
FD_EXHAUSTION = re.compile(r"Too many open files|EMFILE|ENFILE", re.IGNORECASE)


@dataclass
class Round:
    wall: float  # Unix time of the log line
    round: int
    loss: float
    partner: str  # "none" when no partner was chosen; "" for a local round
    pair_s: float = 0.0
    exchange_s: float = 0.0
    solo_reason: str = ""

    @property
    def paired(self):
        return self.partner not in ("none", "") and not self.solo_reason


@dataclass
class Log:
    rounds: list = field(default_factory=list)
    vals: list = field(default_factory=list)  # (wall, round, loss)
    resumed_round: int = None
    joined_round: int = None  # the first state copy from the swarm
    copies: int = 0  # state copies from the swarm that succeeded ("joined at round")
    copy_failures: list = field(default_factory=list)  # (wall, line)
    donors_dropped: list = field(default_factory=list)  # (wall, donor, why)
    fd_errors: list = field(default_factory=list)  # (wall, line)
    errors: list = field(default_factory=list)  # "error ..." and "critical ..." lines
    lines: int = 0


def wall_time(stamp, millis, offset):
    hours, minutes = int(offset[1:3]), int(offset[4:6])
    east = (hours * 3600 + minutes * 60) * (1 if offset[0] == "+" else -1)
    return calendar.timegm(time.strptime(stamp, "%Y-%m-%d %H:%M:%S")) - east + int(millis) / 1000.0


def parse(path):
    log = Log()
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return log
    for raw in text.splitlines():
        log.lines += 1
        m = LINE.match(raw)
        if not m:
            if raw.startswith("error:"):
                log.errors.append(raw)
            if FD_EXHAUSTION.search(raw):
                log.fd_errors.append((None, raw))
            continue
        wall = wall_time(m.group(1), m.group(2), m.group(3))
        level, msg = m.group(4), m.group(5)
        if level in ("error", "critical"):
            log.errors.append(raw)
        if FD_EXHAUSTION.search(msg):
            log.fd_errors.append((wall, raw))
        r = NOLOCO_ROUND.search(msg)
        if r:
            log.rounds.append(Round(wall, int(r.group(2)), float(r.group(3)), r.group(4), float(r.group(7)),
                                    float(r.group(8)), r.group(9) or ""))
            continue
        r = LOCAL_ROUND.search(msg)
        if r:
            log.rounds.append(Round(wall, int(r.group(2)), float(r.group(3)), ""))
            continue
        v = VAL.search(msg)
        if v:
            log.vals.append((wall, int(v.group(1)), float(v.group(2))))
            continue
        v = RESUMED.search(msg)
        if v and log.resumed_round is None:
            log.resumed_round = int(v.group(2))
            continue
        v = JOINED.search(msg)
        if v:
            log.copies += 1
            if log.joined_round is None:
                log.joined_round = int(v.group(1))
            continue
        if COPY_FAILED.search(msg):
            log.copy_failures.append((wall, raw))
            continue
        v = DONOR_DROPPED.search(msg)
        if v:
            log.donors_dropped.append((wall, v.group(1), v.group(2)))
    return log


def tail(path, lines=30):
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError as e:
        return f"(cannot read {path}: {e})"


def window(path, wall_from, wall_to):
    """The log lines stamped within [wall_from, wall_to], and what they say about where the time
    went: pair and exchange seconds of the rounds that ended in it, pacing waits, state copies."""
    lines = []
    summary = {"rounds_ended": 0, "pair_exchange_s": 0.0, "pace_waits": 0, "copies": 0, "copy_failures": 0,
               "solo_reasons": []}
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return lines, summary
    for raw in text.splitlines():
        m = LINE.match(raw)
        if not m:
            continue
        wall = wall_time(m.group(1), m.group(2), m.group(3))
        if wall < wall_from or wall > wall_to:
            continue
        msg = m.group(5)
        if "is not a Starling setting" in msg:
            continue
        lines.append(raw)
        r = NOLOCO_ROUND.search(msg)
        if r:
            summary["rounds_ended"] += 1
            summary["pair_exchange_s"] += float(r.group(7)) + float(r.group(8))
            if r.group(9):
                summary["solo_reasons"].append(r.group(9)[:160])
        elif "is ahead of every member" in msg:
            summary["pace_waits"] += 1
        elif JOINED.search(msg):
            summary["copies"] += 1
        elif COPY_FAILED.search(msg):
            summary["copy_failures"] += 1
    summary["pair_exchange_s"] = round(summary["pair_exchange_s"], 3)
    return lines, summary


SNAPSHOT = re.compile(r"state sync: snapshot [0-9a-f]+ of round \d+ \((\d+) bytes")


def largest_snapshot_bytes(path):
    """The largest snapshot a node's log says it fetched (0 when it fetched none)."""
    try:
        text = Path(path).read_text(errors="replace")
    except OSError:
        return 0
    return max((int(m.group(1)) for m in SNAPSHOT.finditer(text)), default=0)


def refusals_of(text, donor):
    """The warning lines of a log in which a state copy refused a snapshot `donor` (host:port) offered."""
    return [line for line in text.splitlines()
            if " warning " in line and "state sync:" in line and " refused: " in line and donor in line]


def quarantines_of(text, member):
    """The warning lines of a log in which the node quarantined `member` (host:port)."""
    return [line for line in text.splitlines()
            if " warning " in line and "quarantined until round" in line and f"({member})" in line]


def longest_refusal_run(text, member_id):
    """The most messages of node `member_id` (16 hex digits) a log's round lines refused in a row,
    none taken between: two in a row always quarantine a member (peer/member_scores.h; so may
    three in five alternating ones). NoLoCo lines name the partner; a DiLoCo line names only the
    D's it left out, so any other DiLoCo line ends a run (it may have taken the member's D), which
    can only count short."""
    longest = run = 0
    for line in text.splitlines():
        if " round " not in line:
            continue
        if f"| partner {member_id} |" in line:
            refused = f"solo: partner {member_id}:" in line
            if not refused and "solo:" in line:
                continue  # the exchange failed: nothing judged
        elif "| quorum " in line:
            refused = f"member {member_id}:" in line
        else:
            continue
        run = run + 1 if refused else 0
        longest = max(longest, run)
    return longest


HELD_OUT = re.compile(r"\| held-out (?:([\d.]+) of own|not scored)")


@dataclass
class PartnerMessages:
    """What the nodes did with one member's messages."""
    taken: int = 0
    refused: int = 0
    taken_scores: list = field(default_factory=list)  # held-out loss over own, of those taken and scored
    taken_unscored: int = 0  # taken without a held-out score: it claimed fewer tokens than the node
    left_out: int = 0  # DiLoCo rounds that left its D out (a DiLoCo line names no D it took)


def partner_messages(texts, member_id):
    """The round lines of the logs `texts` paired with node `member_id` (16 hex digits): those whose
    outer step used its message (with how the held-out check scored it) and those that refused it
    (`solo: partner ID: ...`), and the DiLoCo rounds that left its D out (`left out: member ID: ...`).
    All zero without an id."""
    result = PartnerMessages()
    if not member_id:
        return result
    for text in texts:
        for line in text.splitlines():
            if " round " in line and "| quorum " in line and f"member {member_id}:" in line:
                result.left_out += 1
            if " round " not in line or f"| partner {member_id} |" not in line:
                continue
            if f"solo: partner {member_id}:" in line:
                result.refused += 1
            elif "solo:" not in line:
                result.taken += 1
                held_out = HELD_OUT.search(line)
                if held_out and held_out.group(1):
                    result.taken_scores.append(float(held_out.group(1)))
                elif held_out:
                    result.taken_unscored += 1
    return result
