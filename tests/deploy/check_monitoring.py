#!/usr/bin/python3
"""Checks deploy/prometheus and deploy/grafana the way Prometheus and Grafana would read them:
promtool loads the alert rules, runs their unit tests and checks the example scrape config; the
dashboard parses, has its data source and node variables, and every PromQL expression in it
parses (as a recording rule promtool checks); and every metric the rules and the dashboard query
is one starlingd exports, as docs/operator.md's metric table lists them (the integration test
holds that table to a real daemon's scrape). promtool comes with Debian's prometheus package,
which scripts/setup installs: without it this check fails rather than skips.

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
# Metric names the daemon's families may appear under in PromQL (labels and functions aside).
QUERIED = re.compile(r"\b((?:starling|process)_[a-z_]+)\b")


def exported_series(source):
    """Every series name starlingd exports, histograms as their _bucket, _sum and _count."""
    names = set()
    for name, kind in TABLE_ROW.findall((source / "docs" / "operator.md").read_text()):
        names |= {name + s for s in ("_bucket", "_sum", "_count")} if kind == "histogram" else {name}
    return names


def queried_names(expr):
    without_strings = re.sub(r'"[^"]*"', '""', expr)
    return set(QUERIED.findall(without_strings))


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


def check_rules(prometheus, exported, problems):
    promtool(["check", "rules", "starling-rules.yml"], prometheus, problems)
    promtool(["test", "rules", "starling-rules.test.yml"], prometheus, problems)
    promtool(["check", "config", "prometheus.yml"], prometheus, problems)
    rules = yaml.safe_load((prometheus / "starling-rules.yml").read_text())
    tested = {case["alertname"] for test in yaml.safe_load((prometheus / "starling-rules.test.yml").read_text())["tests"]
              for case in test.get("alert_rule_test", [])}
    for group in rules["groups"]:
        for rule in group["rules"]:
            name = rule["alert"]
            for missing in sorted(queried_names(rule["expr"]) - exported):
                problems.append(f"starling-rules.yml: {name} queries {missing}, which starlingd does not export")
            for key in ("summary", "description"):
                if not rule.get("annotations", {}).get(key):
                    problems.append(f"starling-rules.yml: {name} has no {key}")
            if name not in tested:
                problems.append(f"starling-rules.test.yml: no test case for {name}")


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
        {"record": f"dashboard:query_{i}", "expr": re.sub(r"\$\{?\w+\}?", ".*", expr)} for i, (_, expr) in
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
    check_rules(source / "deploy" / "prometheus", exported, problems)
    check_dashboard(source / "deploy" / "grafana", exported, problems)
    for problem in problems:
        print(problem)
    print(f"monitoring: {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
