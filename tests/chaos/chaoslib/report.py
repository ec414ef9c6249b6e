"""The figures of a chaos run, computed from what the run recorded and the daemons' logs, the
pass/fail checks over them, and the table and JSON they are printed as."""

import bisect
import json
import re
import statistics

from . import logs


def pct(a, b):
    return 100.0 * a / b if b else 0.0


def growth_span(samples, after_s, min_span_s):
    """(first sample at least `after_s` in, last sample by the middle of the span, last sample), or
    None when the span is shorter than `min_span_s`."""
    base = next(((t, kb) for t, kb in samples if t >= after_s), None)
    if base is None or samples[-1][0] - base[0] < min_span_s:
        return None
    last = samples[-1]
    middle = [(t, kb) for t, kb in samples if base[0] <= t <= (base[0] + last[0]) / 2][-1]
    return base, middle, last


def rss_growth(instances, after_s=60.0, min_span_s=30.0):
    """Per process that lived long enough: last VmRSS sample against the first one taken at least
    `after_s` after its start (the start-up allocations are done by then), in %; and over the
    second half of that span alone, which tells a creep (as much again) from a high-water mark
    reached early (about 0). The same for the anonymous pages alone (RssAnon), where sampled."""
    rows = []
    for inst in instances:
        span = growth_span(list(inst.rss), after_s, min_span_s)
        if span is None:
            continue
        base, middle, last = span
        row = {"instance": inst.label, "from_s": round(base[0], 1), "to_s": round(last[0], 1),
               "rss_from_kb": base[1], "rss_to_kb": last[1],
               "growth_pct": round(pct(last[1] - base[1], base[1]), 2),
               "second_half_growth_pct": round(pct(last[1] - middle[1], middle[1]), 2)}
        anon = growth_span(list(getattr(inst, "rss_anon", [])), after_s, min_span_s)
        if anon is not None:
            (_, a0), (_, am), (_, a1) = anon
            row.update({"anon_from_kb": a0, "anon_to_kb": a1, "anon_growth_pct": round(pct(a1 - a0, a0), 2),
                        "anon_second_half_growth_pct": round(pct(a1 - am, am), 2)})
        rows.append(row)
    return rows


def solo_reason_kind(reason):
    """A solo reason with node ids and round numbers taken out, so that alike ones add up."""
    reason = re.sub(r"\b[0-9a-f]{16}\b", "N", reason)
    reason = re.sub(r"\bround \d+", "round R", reason)
    return reason[:160]


def report_reason(reason):
    return reason if len(reason) <= 100 else reason[:97] + "..."


def stopped_during(inst, start, end):
    return any(a < end and (b is None or b > start) for a, b in inst.stops)


def churn_within(churn, start, end):
    """Whether the sorted times `churn` hold one within [start, end]."""
    i = bisect.bisect_left(churn, start)
    return i < len(churn) and churn[i] <= end


def round_shares(parsed, churn_walls=(), calm_window_s=0.0):
    """Paired and solo rounds over every chaos process's log. The longest network wait of a round
    (pair + exchange) leaves out rounds during which the script had the node SIGSTOPped. Rounds
    away from churn: those that ended with no action, restart or SIGCONT in the calm_window_s
    before (a round's pairing, exchange and inner phase)."""
    churn = sorted(churn_walls)
    paired = solo_none = solo_failed = 0
    calm = {"rounds": 0, "paired": 0, "solo_no_partner": 0, "solo_exchange_failed": 0}
    reasons = {}
    worst_wait = None
    for inst, lg in parsed:
        for r in lg.rounds:
            if not r.partner:  # a local round: not a swarm node's
                continue
            wait = r.pair_s + r.exchange_s
            if stopped_during(inst, r.wall - wait - 1.0, r.wall):
                pass
            elif worst_wait is None or wait > worst_wait["seconds"]:
                worst_wait = {"instance": inst.label, "round": r.round, "seconds": round(wait, 3),
                              "pair_s": r.pair_s, "exchange_s": r.exchange_s, "solo": r.solo_reason}
            is_calm = calm_window_s > 0 and not churn_within(churn, r.wall - calm_window_s, r.wall)
            calm["rounds"] += is_calm
            if r.paired:
                paired += 1
                calm["paired"] += is_calm
            elif r.partner == "none":
                solo_none += 1
                calm["solo_no_partner"] += is_calm
            else:
                solo_failed += 1
                calm["solo_exchange_failed"] += is_calm
                key = solo_reason_kind(r.solo_reason)
                reasons[key] = reasons.get(key, 0) + 1
    total = paired + solo_none + solo_failed
    calm["paired_pct"] = round(pct(calm["paired"], calm["rounds"]), 1)
    calm["window_s"] = round(calm_window_s, 1)
    return {"rounds": total, "paired": paired, "solo": solo_none + solo_failed, "solo_no_partner": solo_none,
            "solo_exchange_failed": solo_failed, "paired_pct": round(pct(paired, total), 1),
            "solo_pct": round(pct(solo_none + solo_failed, total), 1),
            "solo_reasons": dict(sorted(reasons.items(), key=lambda kv: -kv[1])[:8]), "worst_wait": worst_wait,
            "away_from_churn": calm}


def natted_figures(parsed, churn_walls, calm_window_s):
    """The nodes behind NAT (--natted) against the public chaos nodes: each side's paired share,
    away from churn when both have rounds there, else over all rounds, and the median time of
    a paired exchange; and the hidden processes' hole punches and exchanges through a relay, from
    each one's last status. `parsed`: every chaos process with its log."""
    sides = {"natted": [(i, lg) for i, lg in parsed if i.node.hidden],
             "public": [(i, lg) for i, lg in parsed if not i.node.hidden and i.node.role == "chaos"]}
    shares = {k: round_shares(v, churn_walls, calm_window_s) for k, v in sides.items()}
    calm = all(s["away_from_churn"]["rounds"] for s in shares.values())
    out = {"over": "rounds away from churn" if calm else "all rounds",
           "nodes": sorted({i.node.name for i, _ in sides["natted"]})}
    for k, side in sides.items():
        s = shares[k]
        ex = [r.exchange_s for _, lg in side for r in lg.rounds if r.paired]
        out[k] = {"rounds": s["away_from_churn"]["rounds"] if calm else s["rounds"],
                  "paired_pct": s["away_from_churn"]["paired_pct"] if calm else s["paired_pct"],
                  "exchange_median_s": round(statistics.median(ex), 3) if ex else None}
    counted = ("hole_punches", "failed_hole_punches", "punched_exchanges", "exchanges_through_relay")
    out["paths"] = {k: sum(int((i.last_status or {}).get(k, 0)) for i, _ in sides["natted"])
                    for k in counted}
    return out


def state_copies(parsed):
    """Copies of the swarm's state (joins and catch-ups) over every chaos process's log."""
    ok = sum(lg.copies for _, lg in parsed)
    failed = [(inst.label, line) for inst, lg in parsed for _, line in lg.copy_failures]
    dropped = {}
    for _, lg in parsed:
        for _, donor, why in lg.donors_dropped:
            key = re.sub(r"^.*?: ", "", why)[:80] if ": " in why else why[:80]
            dropped[key] = dropped.get(key, 0) + 1
    return {"ok": ok, "failed": len(failed), "failed_lines": failed[:5],
            "donors_dropped": sum(dropped.values()), "donors_dropped_why": dropped}


def swarm_val_loss(end_instances, parsed_by_label):
    """The validation loss of the swarm at the end: the newest evaluation round R that a node alive
    at the end logged, and the mean over every such node's loss at R."""
    last_rounds = []
    for inst in end_instances:
        lg = parsed_by_label.get(inst.label)
        if lg and lg.vals:
            last_rounds.append(lg.vals[-1][1])
    if not last_rounds:
        return None
    target = max(last_rounds)
    values = {}
    for inst in end_instances:
        lg = parsed_by_label.get(inst.label)
        for _, rnd, loss in (lg.vals if lg else []):
            if rnd == target:
                values[inst.label] = loss
    return {"round": target, "mean": round(statistics.fmean(values.values()), 4),
            "min": round(min(values.values()), 4), "max": round(max(values.values()), 4), "nodes": values}


def slow_link_figures(inst, lg, rate_changed_wall):
    before = [r for r in lg.rounds if r.partner and (rate_changed_wall is None or r.wall < rate_changed_wall)]
    after = [r for r in lg.rounds if r.partner and rate_changed_wall is not None and r.wall >= rate_changed_wall]

    def part(rounds):
        ex = [r.exchange_s for r in rounds if r.paired]
        return {"rounds": len(rounds), "paired": len(ex),
                "exchange_failed": sum(1 for r in rounds if r.partner != "none" and not r.paired),
                "paired_exchange_median_s": round(statistics.median(ex), 3) if ex else None,
                "paired_exchange_max_s": round(max(ex), 3) if ex else None}

    return {"instance": inst.label, "fast": part(before), "slow": part(after)}


def fmt_s(x):
    return "-" if x is None else f"{x:.1f} s"


def rss_text(m):
    """One rss_growth() row as the table shows it."""
    return (f"{m['growth_pct']:+.1f}% ({m['instance']}, {m['rss_from_kb'] // 1024} -> {m['rss_to_kb'] // 1024} MiB, "
            f"{m['from_s']:.0f}-{m['to_s']:.0f} s, second half {m['second_half_growth_pct']:+.1f}%"
            + (f"; anonymous {m['anon_from_kb'] // 1024} -> {m['anon_to_kb'] // 1024} MiB, {m['anon_growth_pct']:+.1f}%, "
               f"second half {m['anon_second_half_growth_pct']:+.1f}%" if "anon_growth_pct" in m else "") + ")")


def table(rep):
    """The table printed at the end (one row per figure: name, value, verdict)."""
    rows = []
    a = rep["actions"]
    rows.append(("actions", ", ".join(f"{k} {v}" for k, v in a["counts"].items()) +
                 (f"; skipped {a['skipped']}" if a["skipped"] else ""), ""))
    c = rep["crashes"]
    rows.append(("crashes", str(len(c)) + ("" if not c else ": " + "; ".join(f"{x['instance']} {x['what']}"
                                                                            for x in c[:3])), rep["verdict"]["crashes"]))
    d = rep["drains"]
    rows.append(("drains (SIGTERM/leave: exit 0)", f"{d['ok']} ok, {len(d['hung'])} hung, max {fmt_s(d['max_s'])}"
                 f" / bound {d['bound_s']:.1f} s", rep["verdict"]["drains"]))
    s = rep["stall"]
    where = ""
    if s["worst"]:
        w = s["worst"]
        where = f" ({w['instance']} at round {w['round']}, {'/'.join(w['phases']) or '-'}; {w['ended']})"
    rows.append(("max round stall", f"{fmt_s(s['max_s'])}{where} / bound {s['bound_s']:.1f} s",
                 rep["verdict"]["stall"]))
    if s["worst"] and s["worst"].get("log_summary"):
        ls = s["worst"]["log_summary"]
        rows.append(("  in its log", f"{ls['rounds_ended']} round(s) ended, pair+exchange {ls['pair_exchange_s']:.1f} s, "
                     f"{ls['pace_waits']} pacing wait(s), {ls['copies']} state copies, {ls['copy_failures']} failed"
                     + (f"; solo: {report_reason(ls['solo_reasons'][0])}" if ls["solo_reasons"] else ""), ""))
    rows.append(("  bound", s["bound_explained"], ""))
    r = rep["resumes"]
    rows.append(("resumes (same data dir)", f"{r['ok']} ok, {len(r['failed'])} failed", rep["verdict"]["resumes"]))
    j = rep["joins"]
    rows.append(("joins (from a snapshot)", f"{j['ok']} ok, {len(j['failed'])} failed"
                 + (f", slowest {j['slowest_s']:.1f} s" if j["slowest_s"] is not None else "")
                 + f" / bound {j['bound_s']:.0f} s", rep["verdict"]["joins"]))
    f = rep["flood"]
    if f.get("skipped"):
        rows.append(("preface flood", f"skipped: {f['skipped']}", ""))
    else:
        answered = sum(1 for x in f.get("status", []) if x["answered"])
        rows.append(("preface flood", f"{f.get('target')}: {f.get('opened', 0)}/{f.get('connections')} held "
                     f"{f.get('hold_s')} s, {f.get('closed_by_node', 0)} closed by node, status {answered}/"
                     f"{len(f.get('status', []))}, fds {f.get('fds_before')}->{f.get('fds_max')}, "
                     f"{'alive' if f.get('alive') else 'EXITED'}" +
                     (f", {f['fd_errors']} fd errors in log" if f.get("fd_errors") else ""), rep["verdict"]["flood"]))
    ds = rep["double_start"]
    if ds.get("skipped"):
        rows.append(("double start", f"skipped: {ds['skipped']}", ""))
    else:
        refused = sum(1 for x in ds.get("attempts", []) if x["refused"])
        rows.append(("double start", f"{ds.get('target')}: {refused}/{len(ds.get('attempts', []))} refused, target "
                     f"{'answers' if ds.get('target_answers') and ds.get('alive') else 'DOWN'}",
                     rep["verdict"]["double_start"]))
    for name, at in rep["attacks"].items():
        rows.append((name, f"skipped: {at['skipped']}" if at.get("skipped") else at["summary"], at["verdict"]))
    g = rep["rss"]

    if g["max"]:
        rows.append(("max RSS growth", f"{rss_text(g['max'])}; {len(g['per_instance'])} process(es) measured", "info"))
        longest = max(g["per_instance"], key=lambda r: r["to_s"] - r["from_s"])
        rows.append(("  longest-lived process", rss_text(longest), "info"))
    else:
        rows.append(("max RSS growth", "n/a: no process lived 90 s", "info"))
    p = rep["rounds"]
    # The pairing rows read NoLoCo's round lines; a DiLoCo round gathers every member's D.
    pairing = rep["config"].get("method", "noloco") != "diloco"
    if not pairing:
        rows.append(("rounds paired / solo", "- (DiLoCo: each round gathers every member's D)", ""))
    else:
        rows.append(("rounds paired / solo", f"{p['paired']} / {p['solo']} ({p['paired_pct']}% / {p['solo_pct']}%); solo: "
                     f"{p['solo_no_partner']} no partner, {p['solo_exchange_failed']} exchange failed", "info"))
        for reason, n in list(p["solo_reasons"].items())[:3]:
            rows.append(("  solo because", f"{n} x {reason}", ""))
        c = p.get("away_from_churn")
        if c and c["rounds"]:
            rows.append(("  away from churn", f"{c['paired']} / {c['rounds']} paired ({c['paired_pct']}%; no action, restart "
                         f"or SIGCONT in the {c['window_s']:.1f} s before); solo: {c['solo_no_partner']} no partner, "
                         f"{c['solo_exchange_failed']} exchange failed", "info"))
        if p["worst_wait"]:
            w = p["worst_wait"]
            rows.append(("  longest pair+exchange", f"{w['seconds']:.2f} s ({w['instance']} round {w['round']}) / "
                         f"T_pair + T_xchg {rep['config']['pair_timeout_s'] + rep['config']['exchange_timeout_s']:.1f} s "
                         "(rounds with a SIGSTOP left out)",
                         "info"))
    sc = rep["state_copies"]
    rows.append(("state copies (join, catch-up)", f"{sc['ok']} ok, {sc['failed']} failed; {sc['donors_dropped']} donor(s) "
                 "dropped" + (" (" + ", ".join(f"{n} x {w}" for w, n in sc["donors_dropped_why"].items()) + ")"
                              if sc["donors_dropped"] else ""), "info"))
    v = rep["val_loss"]
    if v["swarm"]:
        sw = v["swarm"]
        text = f"{sw['mean']:.4f} (mean of {len(sw['nodes'])} at round {sw['round']}, {sw['min']:.4f}-{sw['max']:.4f})"
    else:
        text = "- (no evaluation logged)"
    if v.get("single") is not None:
        text += f" vs {v['single']:.4f} single ({v['difference']:+.4f})"
    else:
        text += f"; single: {v.get('single_skipped')}"
    rows.append(("val loss vs single", text, "info"))
    sl = rep["slow_link"]
    if sl.get("skipped"):
        rows.append(("slow link", f"skipped: {sl['skipped']}", ""))
    elif not pairing:
        rows.append(("slow link", f"{sl['instance']}: - (its pairing figures are NoLoCo's)", ""))
    else:
        fig = sl.get("figures") or {}
        fast, slow = fig.get("fast", {}), fig.get("slow", {})
        def part(rate, x):
            med = x.get("paired_exchange_median_s")
            return (f"{rate} {x.get('paired', 0)}/{x.get('rounds', 0)} rounds paired"
                    + (f" (exchange median {med:.2f} s)" if med is not None else "")
                    + f", {x.get('exchange_failed', 0)} exchanges failed")
        rows.append(("slow link", f"{sl['instance']}: {part('10 Mbit/s', fast)}; {part('1 Mbit/s', slow)}", "info"))
    nt = rep.get("natted")
    if nt and not pairing:
        rows.append(("behind NAT", f"{', '.join(nt['nodes'])}: - (its pairing figures are NoLoCo's)", ""))
    elif nt:
        def side(x):
            med = x["exchange_median_s"]
            return (f"{x['paired_pct']}% of {x['rounds']} paired"
                    + (f", exchange median {med:.2f} s" if med is not None else ""))
        rows.append(("behind NAT", f"{', '.join(nt['nodes'])}: {side(nt['natted'])}; public nodes {side(nt['public'])} "
                     f"({nt['over']}; checked over 50 rounds a side: at least 90% of the public share)",
                     rep["verdict"]["natted"]))
        p = nt["paths"]
        rows.append(("hidden pairs", f"hole punches {p['hole_punches']} of "
                     f"{p['hole_punches'] + p['failed_hole_punches']} connected, exchanges over them "
                     f"{p['punched_exchanges']}, through a relay {p['exchanges_through_relay']}", "info"))
    rows.append(("status polls", f"{rep['polls']['ok']} answered, {rep['polls']['failed']} not", "info"))
    width = max(len(r[0]) for r in rows)
    out = []
    for name, value, verdict in rows:
        out.append(f"{name:<{width}}  {value}" + (f"  [{verdict}]" if verdict else ""))
    return "\n".join(out)


def write_json(path, rep):
    with open(path, "w") as f:
        json.dump(rep, f, indent=2, default=str)
        f.write("\n")


def parse_all(instances):
    return [(inst, logs.parse(inst.log_path)) for inst in instances]
