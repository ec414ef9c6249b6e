#!/usr/bin/python3
"""Checks deploy/prometheus and deploy/grafana the way Prometheus and Grafana would read them:
promtool loads the alert rules, runs their unit tests and checks the example scrape config; the
dashboard parses, has its data source and node variables, and every PromQL expression in it
parses (as a recording rule promtool checks); and every metric the rules and the dashboard query
is one starlingd exports, as docs/operator.md's metric table lists them (the integration test
holds that table to a real daemon's scrape), or Prometheus's own `up`, on purpose; every alert is
in operator.md's alert table. promtool comes with Debian's prometheus package, which
scripts/setup installs: without it this check fails rather than skips. real_prometheus.py runs
the rules and the dashboard's queries in a real Prometheus against real daemons.

usage: check_monitoring.py SOURCE_DIR   (exits 1 naming every problem found)
"""
import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

# A family name in the metric table's first column: | `name{labels}` | type | ...
TABLE_ROW = re.compile(r"^\| `([a-z_]+)[^`]*` \| (counter|gauge|histogram) \|", re.MULTILINE)
# A name in PromQL once strings, label matchers, ranges and label lists are gone: a metric, unless
# it is a function (followed by a parenthesis), a keyword or part of a number (1e8).
NAME = re.compile(r"(?<![\w.$])([a-zA-Z_:][a-zA-Z0-9_:]*)\b(?!\s*\()")
KEYWORDS = {"and", "or", "unless", "on", "ignoring", "by", "without", "group_left", "group_right",
            "bool", "offset", "Inf", "NaN", "inf", "nan"}
LABEL_LISTS = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
# Series the rules may query that starlingd does not export, each on purpose: Prometheus's own.
PROMETHEUS_SERIES = {
    "up": "Prometheus's scrape health of each target, the one series left when a node is down",
}
# Grafana's interval variables, of the size Grafana gives them for a data source scraped every
# second over the last hour or so ($__rate_interval is max($__interval + the scrape interval, 4
# scrape intervals)); real_prometheus.py queries a Prometheus scraping every second with them. The
# other variables ($swarm, $node) select everything, as the dashboard's "All" does.
GRAFANA_INTERVALS = {"__rate_interval": "15s", "__interval": "5s", "__range": "1h"}


def exported_series(source):
    """Every series name starlingd exports, histograms as their _bucket, _sum and _count."""
    names = set()
    for name, kind in TABLE_ROW.findall((source / "docs" / "operator.md").read_text()):
        names |= {name + s for s in ("_bucket", "_sum", "_count")} if kind == "histogram" else {name}
    return names


def queried_names(expr):
    """Every metric name an expression selects."""
    bare = re.sub(r'"[^"]*"', '""', expr)
    bare = re.sub(r"\{[^}]*\}", "", bare)
    bare = re.sub(r"\[[^\]]*\]", "", bare)
    bare = LABEL_LISTS.sub("", bare)
    return set(NAME.findall(bare)) - KEYWORDS


def grafana_substitute(expr, intervals=GRAFANA_INTERVALS):
    """A dashboard query as Grafana sends it: interval variables as durations, the others as .*"""
    def value(match):
        return intervals.get(match.group(1), ".*")
    return re.sub(r"\$\{?(\w+)\}?", value, expr)


def promtool(args, cwd, problems):
    result = subprocess.run(["promtool", *args], cwd=cwd, capture_output=True, text=True)
    if result.returncode != 0:
        problems.append(f"promtool {' '.join(args)}: exit {result.returncode}\n{result.stdout}{result.stderr}")


def dashboard_exprs(dashboard):
    exprs = []
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            exprs.append((panel["title"], target["expr"]))
    return exprs


def check_rules(prometheus, exported, documented_alerts, problems):
    promtool(["check", "rules", "starling-rules.yml"], prometheus, problems)
    promtool(["test", "rules", "starling-rules.test.yml"], prometheus, problems)
    promtool(["check", "config", "prometheus.yml"], prometheus, problems)
    rules = yaml.safe_load((prometheus / "starling-rules.yml").read_text())
    tested = {case["alertname"] for test in yaml.safe_load((prometheus / "starling-rules.test.yml").read_text())["tests"]
              for case in test.get("alert_rule_test", [])}
    for group in rules["groups"]:
        for rule in group["rules"]:
            name = rule["alert"]
            for missing in sorted(queried_names(rule["expr"]) - exported - PROMETHEUS_SERIES.keys()):
                problems.append(f"starling-rules.yml: {name} queries {missing}, which starlingd does not export")
            for key in ("summary", "description"):
                if not rule.get("annotations", {}).get(key):
                    problems.append(f"starling-rules.yml: {name} has no {key}")
            if name not in tested:
                problems.append(f"starling-rules.test.yml: no test case for {name}")
            if name not in documented_alerts:
                problems.append(f"docs/operator.md: {name} is not in the alert table")


def check_dashboard(grafana, exported, problems):
    dashboard = json.loads((grafana / "starling-dashboard.json").read_text())
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    if variables.get("datasource", {}).get("type") != "datasource" or \
            variables["datasource"].get("query") != "prometheus":
        problems.append("starling-dashboard.json: no Prometheus data source variable")
    if "node" not in variables:
        problems.append("starling-dashboard.json: no node variable")
    exprs = dashboard_exprs(dashboard)
    if not exprs:
        problems.append("starling-dashboard.json: no queries")
    for title, expr in exprs:
        for missing in sorted(queried_names(expr) - exported):
            problems.append(f"starling-dashboard.json: panel {title!r} queries {missing}, which starlingd does not export")
    # Each query as a recording rule, the variables filled in, so promtool parses its PromQL.
    rules = {"groups": [{"name": "dashboard", "rules": [
        {"record": f"dashboard:query_{i}", "expr": grafana_substitute(expr)} for i, (_, expr) in
        enumerate(exprs)]}]}
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "dashboard-queries.yml").write_text(yaml.safe_dump(rules))
        promtool(["check", "rules", "dashboard-queries.yml"], tmp, problems)


def main(source_dir):
    source = Path(source_dir)
    problems = []
    if not shutil.which("promtool"):
        print("promtool not found: install Debian's prometheus package (scripts/setup does)")
        return 1
    exported = exported_series(source)
    if len(exported) < 25:
        problems.append(f"docs/operator.md: only {len(exported)} series in the metric table")
    documented_alerts = set(re.findall(r"^\| `(\w+)` \|", (source / "docs" / "operator.md").read_text(), re.MULTILINE))
    check_rules(source / "deploy" / "prometheus", exported, documented_alerts, problems)
    check_dashboard(source / "deploy" / "grafana", exported, problems)
    for problem in problems:
        print(problem)
    print(f"monitoring: {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
