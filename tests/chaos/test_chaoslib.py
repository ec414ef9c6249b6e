"""Unit tests of the chaos suite's own parts (no daemon needed):
    PYTHONDONTWRITEBYTECODE=1 python3 -m unittest discover -s tests/chaos -p 'test_*.py'
The log lines are copied from real starlingd logs of a chaos run."""

import socket
import tempfile
import threading
import time
import tomllib
import unittest
from pathlib import Path

from chaoslib import attacks, config, hostile, logs, report
from chaoslib.daemons import StallTracker

LOG = """\
# chaos: starlingd --config chaos.toml
[2026-11-25 10:39:31.430 +00:00] info resumed from checkpoint /tmp/c/nodes/n2/checkpoints/step_00000040 (round 40, inner step 800)
[2026-11-25 10:39:43.359 +00:00] info swarm: node b781ae37884918a2 joined at round 44 (inner step 880) from a snapshot of 1971232 bytes
[2026-11-25 10:39:43.675 +00:00] info swarm: node b781ae37884918a2 round 44 | loss 1.4950 | partner none | sent 0 B, received 0 B | pair 0.001 s, exchange 0.000 s
[2026-11-25 10:39:51.066 +00:00] info swarm: node b781ae37884918a2 round 45 | loss 1.5029 | partner b40d1eabbdfd3638 | sent 132384 B, received 131472 B | pair 0.001 s, exchange 7.069 s
[2026-11-25 10:40:01.411 +00:00] info swarm: node b781ae37884918a2 round 46 | loss 1.4894 | partner b0b3b833f7507179 | sent 0 B, received 0 B | pair 0.001 s, exchange 10.004 s | solo: exchange with node b0b3b833f7507179 for round 46: the partner did not open the exchange before the deadline
[2026-11-25 10:40:01.500 +00:00] info round 50: validation loss of the averaged weights 1.6443
[2026-11-25 10:40:02.000 +00:00] info swarm: node 6c25bf73e2c75488 round 9 | loss 1.9560 | local
[2026-11-25 10:40:03.000 +00:00] error accept: Too many open files
"""


class LogTest(unittest.TestCase):
    def test_parse(self):
        with tempfile.TemporaryDirectory() as d:
            path = Path(d) / "n.log"
            path.write_text(LOG)
            lg = logs.parse(path)
        self.assertEqual(lg.resumed_round, 40)
        self.assertEqual(lg.joined_round, 44)
        self.assertEqual([r.round for r in lg.rounds], [44, 45, 46, 9])
        self.assertEqual([r.paired for r in lg.rounds], [False, True, False, False])
        self.assertEqual(lg.rounds[2].exchange_s, 10.004)
        self.assertIn("did not open the exchange", lg.rounds[2].solo_reason)
        self.assertEqual(lg.rounds[3].partner, "")
        self.assertEqual([(r, v) for _, r, v in lg.vals], [(50, 1.6443)])
        self.assertEqual(len(lg.fd_errors), 1)
        self.assertEqual(len(lg.errors), 1)
        self.assertAlmostEqual(lg.rounds[1].wall - lg.rounds[0].wall, 7.391, places=3)

    def test_round_shares_away_from_churn(self):
        with tempfile.TemporaryDirectory() as d:
            path = Path(d) / "n.log"
            path.write_text(LOG)
            lg = logs.parse(path)

        class Inst:
            label = "n0#0"
            stops = []
        swarm_rounds = lg.rounds[:3]  # ended at +0, +7.4 and +17.7 s; the local round is no swarm's
        first = swarm_rounds[0].wall
        # Churn 1 s before the second round ended: with a 5 s window only the first and third are calm.
        shares = report.round_shares([(Inst(), lg)], [first + 6.4], 5.0)
        self.assertEqual((shares["rounds"], shares["paired"], shares["solo_no_partner"]), (3, 1, 1))
        calm = shares["away_from_churn"]
        self.assertEqual((calm["rounds"], calm["paired"], calm["solo_no_partner"], calm["solo_exchange_failed"]),
                         (2, 0, 1, 1))
        self.assertEqual(calm["paired_pct"], 0.0)
        # A window of 0: no round is counted calm.
        self.assertEqual(report.round_shares([(Inst(), lg)], [], 0.0)["away_from_churn"]["rounds"], 0)

    def test_solo_reason_kind(self):
        a = report.solo_reason_kind("exchange with node b0b3b833f7507179 for round 46: the partner did not open")
        b = report.solo_reason_kind("exchange with node a9889d0dcb6b3198 for round 5: the partner did not open")
        self.assertEqual(a, b)


class StallTest(unittest.TestCase):
    def test_longest_interval_between_round_changes(self):
        s = StallTracker()
        for t, r in [(0, 1), (1, 1), (2, 2), (3, 2), (9, 2), (10, 3)]:
            s.observe(t, r, "training")
        self.assertEqual(s.max, 8)  # round 2 first seen at 2, round 3 first seen at 10
        self.assertEqual(s.max_info["round"], 2)

    def test_close_counts_the_open_interval_and_stops_the_clock(self):
        s = StallTracker()
        s.observe(0, 5, "exchanging")
        s.close(12, "SIGSTOP")
        self.assertEqual(s.max, 12)
        s.observe(30, 5, "training")  # after SIGCONT the clock starts again
        s.observe(31, 6, "training")
        self.assertEqual(s.max, 12)
        self.assertEqual(s.max_info["ended"], "SIGSTOP")


    def test_a_fresh_node_starts_the_clock_after_joining(self):
        s = StallTracker(("starting", "joining"))
        s.observe(0, 0, "starting")
        s.observe(20, 0, "joining")  # the join check's time, not a stall
        s.observe(21, 37, "training")
        s.observe(23, 38, "exchanging")
        self.assertEqual(s.max, 2)
        s.observe(40, 38, "joining")  # a later catch-up counts
        s.observe(41, 50, "training")
        self.assertEqual(s.max, 18)


class ConfigTest(unittest.TestCase):
    def test_derive_replaces_and_adds_keys(self):
        text = "[train]\nsteps = 1000  # c\nseed = 1\n\n[peer]\nseeds = []\n"
        out = config.derive(text, {"train": {"steps": 7, "threads": 1}, "peer": {"seeds": ["a:1"]},
                                   "metrics": {"listen": ""}})
        cfg = tomllib.loads(out)
        self.assertEqual(cfg["train"], {"steps": 7, "seed": 1, "threads": 1})
        self.assertEqual(cfg["peer"]["seeds"], ["a:1"])
        self.assertEqual(cfg["metrics"]["listen"], "")

    def test_pico_derives(self):
        pico = Path(__file__).resolve().parents[2] / "configs" / "pico.toml"
        with tempfile.TemporaryDirectory() as d:
            chaos, single, cfg = config.write_configs(pico, Path(d), Path("/data/kjv"), 10_000_000)
            single_cfg = tomllib.loads(single.read_text())
        self.assertEqual(cfg["swarm"]["method"], "noloco")
        self.assertEqual(single_cfg["swarm"]["method"], "local")
        self.assertEqual(cfg["train"]["steps"], 10_000_000)
        self.assertEqual(cfg["data"]["dir"], "/data/kjv")
        s = config.Settings(cfg)
        self.assertEqual((s.pair_timeout_s, s.exchange_timeout_s, s.inner_steps), (5.0, 10.0, 20))
        self.assertEqual(s.tokens_per_step, 16 * 64)

    def test_settings_reach_both_configs_but_the_single_run_stays_local(self):
        pico = Path(__file__).resolve().parents[2] / "configs" / "pico.toml"
        settings = [config.parse_setting(t) for t in
                    ("swarm.method=diloco", "exchange.delta_codec=TOPK", "exchange.topk_density=0.05",
                     "swarm.checkpoint_every=7")]
        self.assertEqual(settings[1:3], [("exchange", "delta_codec", "TOPK"), ("exchange", "topk_density", 0.05)])
        with tempfile.TemporaryDirectory() as d:
            chaos, single, cfg = config.write_configs(pico, Path(d), Path("/data/kjv"), 10_000_000, settings)
            single_cfg = tomllib.loads(single.read_text())
        self.assertEqual((cfg["swarm"]["method"], single_cfg["swarm"]["method"]), ("diloco", "local"))
        for c in (cfg, single_cfg):
            self.assertEqual(c["exchange"]["delta_codec"], "TOPK")
            self.assertEqual(c["exchange"]["topk_density"], 0.05)
            self.assertEqual(c["swarm"]["checkpoint_every"], 7)
        self.assertEqual(config.Settings(cfg).checkpoint_every, 7)
        for bad in ("delta_codec=TOPK", "exchange.delta_codec", "exchange.=1", "exchange.topk_density="):
            with self.assertRaises(ValueError):
                config.parse_setting(bad)


class RssTest(unittest.TestCase):
    def test_growth_from_the_sample_60_s_after_start(self):
        class Inst:
            label = "n0#0"
            rss = [(1, 50000), (59, 80000), (61, 100000), (120, 110000)]
        rows = report.rss_growth([Inst()])
        self.assertEqual(rows[0]["growth_pct"], 10.0)
        self.assertEqual(rows[0]["second_half_growth_pct"], 10.0)  # from the last sample by the middle: 61 s
        Inst.rss = [(61, 100000), (70, 110000), (100, 110000), (130, 121000)]
        self.assertEqual(report.rss_growth([Inst()])[0]["second_half_growth_pct"], 10.0)  # from 110000 at 70 s
        Inst.rss = [(61, 100000), (70, 120000), (100, 120000), (130, 120000)]  # a plateau
        self.assertEqual(report.rss_growth([Inst()])[0]["growth_pct"], 20.0)
        self.assertEqual(report.rss_growth([Inst()])[0]["second_half_growth_pct"], 0.0)
        Inst.rss = [(1, 50000), (61, 100000), (80, 200000)]  # under 30 s after the 60 s sample
        self.assertEqual(report.rss_growth([Inst()]), [])

    def test_anonymous_pages_measured_apart(self):
        class Inst:
            label = "n0#0"
            rss = [(61, 100000), (70, 110000), (100, 110000), (130, 110000)]
            rss_anon = [(61, 40000), (70, 40000), (100, 41000), (130, 42000)]  # a creep of its own
        row = report.rss_growth([Inst()])[0]
        self.assertEqual((row["growth_pct"], row["second_half_growth_pct"]), (10.0, 0.0))
        self.assertEqual((row["anon_from_kb"], row["anon_to_kb"], row["anon_growth_pct"]), (40000, 42000, 5.0))
        self.assertEqual(row["anon_second_half_growth_pct"], 5.0)  # from 40000 at 70 s
        self.assertIn("; anonymous 39 -> 41 MiB, +5.0%, second half +5.0%)", report.rss_text(row))


if __name__ == "__main__":
    unittest.main()


class AttackBytesTest(unittest.TestCase):
    def test_rapid_reset_frames_by_hand(self):
        block = (b"\x83\x86" + b"\x04\x02/x" + b"\x01\x09localhost" + b"\x0f\x10\x10application/grpc"
                 + b"\x00\x02te\x08trailers")
        self.assertEqual(attacks.call_headers("/x"), block)
        out = attacks.rapid_reset_bytes("/x", 2, 7)
        headers = bytes([0, 0, len(block), 1, 4, 0, 0, 0, 7]) + block
        reset = bytes([0, 0, 4, 3, 0, 0, 0, 0, 7, 0, 0, 0, 8])
        self.assertEqual(out[:len(headers)], headers)
        self.assertEqual(out[len(headers):len(headers) + len(reset)], reset)
        self.assertEqual(out[len(headers) + len(reset) + 8], 9)  # the second pair is on stream 9
        self.assertEqual(len(out), 2 * (len(headers) + len(reset)))
        self.assertEqual(attacks.opening(), b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0]))

    def test_refusals_name_the_donor(self):
        line = ("[2026-11-28 05:57:19.922 +00:00] warning state sync: snapshot 2a21058a of round 31 from "
                "10.251.148.1:37621 refused: phi's norm 1.40732e+13 is not within a factor of 10 of the median 53.0017")
        text = "\n".join([line, line.replace("warning", "info"), line.replace("37621", "37622")])
        self.assertEqual(logs.refusals_of(text, "10.251.148.1:37621"), [line])
        self.assertEqual(hostile.refusal_reason(line), "phi's norm 1.40732e+13, the median 53.0017")

    def test_quarantines_name_the_member(self):
        line = ("[2026-11-28 06:40:01.002 +00:00] warning peer: node 8e5efe4e342c4fdc (10.251.148.1:37621) quarantined "
                "until round 61 (8 rounds, quarantine 1): 2 of its last 2 messages refused (2 refused, 0 accepted in "
                "all), the last: partner 8e5efe4e342c4fdc: its distance from this node's values, 1e12, exceeds ...")
        self.assertEqual(logs.quarantines_of(line, "10.251.148.1:37621"), [line])
        self.assertEqual(logs.quarantines_of(line, "10.251.148.1:3762"), [])

    def test_partner_messages_count_taken_and_refused(self):
        head = "[2026-11-29 07:46:14.502 +00:00] info swarm: node dc676673e825ecf1 round "
        pair = " | loss 1.4522 | partner defaf3692fb8bb9a | sent 132384 B, received 132384 B | pair 0.569 s, exchange 0.015 s"
        taken = head + "45" + pair + " | held-out 1.021 of own | landed 10 steps on, waited 0.000 s"
        unscored = head + "48" + pair + " | held-out not scored (claims 1280 tokens)"
        refused = (head + "46" + pair + " | held-out 1.208 of own | landed 10 steps on, waited 0.000 s | solo: partner "
                   "defaf3692fb8bb9a: its weights score 1.6309 on a held-out batch, more than 1.05 times this node's "
                   "own 1.3496")
        failed = head + "47" + pair + " | solo: exchange with node defaf3692fb8bb9a for round 47: the stream ended"
        other = taken.replace("defaf3692fb8bb9a", "0123456789abcdef")
        text = "\n".join([taken, unscored, refused, failed, other])
        self.assertEqual(logs.partner_messages([text, taken], "defaf3692fb8bb9a"),
                         logs.PartnerMessages(taken=3, refused=1, taken_scores=[1.021, 1.021], taken_unscored=1))
        self.assertEqual(logs.partner_messages([text], None), logs.PartnerMessages())
        # A failed exchange neither breaks a run of refusals nor adds to it; a taken message ends it.
        runs = "\n".join([refused, failed, refused, other, refused, taken, refused])
        self.assertEqual(logs.longest_refusal_run(runs, "defaf3692fb8bb9a"), 3)
        self.assertEqual(logs.longest_refusal_run(runs, "0123456789abcdef"), 0)
        # DiLoCo: a D left out counts, any other round line ends the run.
        diloco = ("[2026-12-05 21:50:06.962 +00:00] info swarm: node e7a72e4678dff576 round {} | loss 1.5 | quorum 7 | "
                  "sent 27252 B, received 27252 B | gather 3.288 s | landed 12 steps on, waited 1.846 s")
        left_out = diloco + (" | left out: member 1111222233334444: its D is more than 10 times the norm allowed it, left "
                             "out; member c5e42fd4416b9488: its D points away from the others', left out (cosine -0.145)")
        lines = [left_out.format(25), diloco.format(26), left_out.format(27), left_out.format(28)]
        self.assertEqual(logs.longest_refusal_run("\n".join(lines), "c5e42fd4416b9488"), 2)
        self.assertEqual(logs.longest_refusal_run("\n".join(lines), "e7a72e4678dff576"), 0)
        self.assertEqual(logs.partner_messages(["\n".join(lines)], "c5e42fd4416b9488"),
                         logs.PartnerMessages(left_out=3))
        parsed = logs.NOLOCO_ROUND.search(refused)
        self.assertEqual((parsed.group(2), parsed.group(8)), ("46", "0.015"))
        self.assertTrue(parsed.group(9).startswith("partner defaf3692fb8bb9a: its weights score"))


class Listener:
    """A TCP server on 127.0.0.1 that records each connection's source address and closes the
    first `close_first` connections at once."""

    def __init__(self, close_first=0):
        self.sock = socket.create_server(("127.0.0.1", 0), backlog=128)
        self.port = self.sock.getsockname()[1]
        self.sources, self.kept, self.close_first = [], [], close_first
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self):
        while True:
            try:
                conn, (host, _) = self.sock.accept()
            except OSError:
                return
            self.sources.append(host)
            if len(self.sources) <= self.close_first:
                conn.close()
            else:
                self.kept.append(conn)

    def close(self):
        self.sock.close()
        for c in self.kept:
            c.close()


class AttackSocketsTest(unittest.TestCase):
    def test_preface_flood_spreads_sources_and_reopens_what_is_closed(self):
        server = Listener(close_first=5)
        flood = attacks.PrefaceFlood("127.0.0.1", server.port, 20, ["127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5"])
        flood.start()
        self.assertTrue(flood.opened.wait(10))
        deadline = time.monotonic() + 10
        while len(server.sources) < 25 and time.monotonic() < deadline:
            time.sleep(0.1)
        flood.stop()
        server.close()
        f = flood.figures()
        self.assertEqual(f["opened"], 20)
        self.assertEqual(f["reopened"], 5)
        self.assertEqual(len(server.sources), 25)
        self.assertEqual(sorted(set(server.sources[:20])), ["127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5"])

    def test_attack_counts_connections_the_node_closes(self):
        server = Listener(close_first=3)
        attack = attacks.Attack("rapid_reset", "127.0.0.1", server.port, "/x", source="127.0.0.9").start()
        deadline = time.monotonic() + 10
        while len(server.sources) < 4 and time.monotonic() < deadline:
            time.sleep(0.05)
        attack.stop()
        server.close()
        f = attack.figures()
        self.assertEqual(f["ended"].get("closed by node"), 3)
        self.assertEqual(f["connections"], 4)
        self.assertGreater(f["streams"], 0)
        self.assertEqual(set(server.sources), {"127.0.0.9"})
