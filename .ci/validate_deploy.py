#!/usr/bin/env python3
"""Checks of the deploy files that no off-the-shelf validator makes; run by .ci/validate-deploy.

- docker-compose.yml: durations in Go's syntax (what Docker Compose parses; docker-compose 1.29
  and the JSON schema accept any string), and every bind-mounted source file exists.
- deploy/grafana/ferry-dashboard.json: valid JSON, unique panel ids, the `${DS_PROMETHEUS}` input,
  and every `ferry_*` name a metric of the telemetry spec (histogram suffixes on histograms only).
- deploy/prometheus/ferry-alerts.yml: valid YAML, and the same metric-name rule.
- Every PromQL expression of the dashboard is written to a rule file (PROMQL_OUT) so that
  `promtool check rules` parses it.

The telemetry spec is read from crates/ferry/src/telemetry/metrics.rs: the `pub const NAME: &str =
"ferry_..."` constants and the `spec(NAME, C|G|H, ...)` entries of `SPEC`.
Usage: validate_deploy.py REPO_ROOT PROMQL_OUT
"""

import json
import os
import re
import sys

import yaml

errors = []


def error(where, msg):
    errors.append(f"{where}: {msg}")


def load_spec(root):
    path = os.path.join(root, "crates/ferry/src/telemetry/metrics.rs")
    src = open(path, encoding="utf-8").read()
    consts = dict(re.findall(r'pub const ([A-Z_]+): &str = "(ferry_[a-z0-9_]+)";', src))
    kinds = {}
    for const, kind in re.findall(r"spec\(([A-Z_]+), ([CGH]),", src):
        if const not in consts:
            error(path, f"SPEC names {const}, which is not a metric-name constant")
            continue
        kinds[consts[const]] = {"C": "counter", "G": "gauge", "H": "histogram"}[kind]
    if len(kinds) < 10:
        error(path, f"found only {len(kinds)} metrics in SPEC: has the table's format changed?")
    return kinds


def check_names(where, expr, kinds):
    for name in re.findall(r"\bferry_[a-z0-9_]+", expr):
        if name in kinds:
            continue
        base, _, suffix = name.rpartition("_")
        if suffix in ("bucket", "sum", "count") and kinds.get(base) == "histogram":
            continue
        error(where, f"{name} is not a metric of crates/ferry/src/telemetry/metrics.rs")


# Go's time.ParseDuration, which Docker Compose uses for healthcheck and stop_grace_period values.
GO_DURATION = re.compile(r"^([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+$")
DURATION_KEYS = ("interval", "timeout", "start_period", "start_interval")


def check_compose(root):
    path = os.path.join(root, "docker-compose.yml")
    doc = yaml.safe_load(open(path, encoding="utf-8"))
    for name, svc in (doc.get("services") or {}).items():
        where = f"{path}: services.{name}"
        health = svc.get("healthcheck") or {}
        durations = [(f"healthcheck.{k}", health[k]) for k in DURATION_KEYS if k in health]
        if "stop_grace_period" in svc:
            durations.append(("stop_grace_period", svc["stop_grace_period"]))
        for key, value in durations:
            if not GO_DURATION.match(str(value)):
                error(where, f"{key} = {value!r} is not a duration like 5s or 1m30s")
        for vol in svc.get("volumes") or []:
            source = vol.split(":")[0] if isinstance(vol, str) else vol.get("source", "")
            if source.startswith((".", "/")):
                if not os.path.exists(os.path.join(root, source)):
                    error(where, f"bind mount source {source} does not exist")


def check_dashboard(root, kinds):
    path = os.path.join(root, "deploy/grafana/ferry-dashboard.json")
    try:
        dash = json.load(open(path, encoding="utf-8"))
    except ValueError as e:
        error(path, f"invalid JSON: {e}")
        return []
    if not isinstance(dash.get("schemaVersion"), int):
        error(path, "schemaVersion is missing")
    inputs = [i.get("name") for i in dash.get("__inputs", [])]
    if "DS_PROMETHEUS" not in inputs:
        error(path, "no DS_PROMETHEUS input")
    exprs, ids = [], set()
    panels = list(dash.get("panels", []))
    while panels:
        panel = panels.pop()
        panels.extend(panel.get("panels", []))
        where = f"{path}: panel {panel.get('title')!r}"
        if panel.get("id") in ids:
            error(where, f"duplicate panel id {panel.get('id')}")
        ids.add(panel.get("id"))
        if panel.get("type") != "row" and "gridPos" not in panel:
            error(where, "no gridPos")
        for target in panel.get("targets", []):
            ds = target.get("datasource") or panel.get("datasource") or {}
            if ds.get("uid") != "${DS_PROMETHEUS}":
                error(where, f"datasource {ds!r} is not the ${{DS_PROMETHEUS}} input")
            expr = target.get("expr", "")
            if not expr:
                error(where, f"target {target.get('refId')} has no expr")
                continue
            check_names(where, expr, kinds)
            exprs.append((where, expr))
    for var in dash.get("templating", {}).get("list", []):
        check_names(f"{path}: variable {var.get('name')}", var.get("definition", ""), kinds)
    return exprs


def check_alerts(root, kinds):
    path = os.path.join(root, "deploy/prometheus/ferry-alerts.yml")
    doc = yaml.safe_load(open(path, encoding="utf-8"))
    count = 0
    for group in doc.get("groups", []):
        for rule in group.get("rules", []):
            count += 1
            check_names(f"{path}: {rule.get('alert') or rule.get('record')}", rule.get("expr", ""), kinds)
    if count == 0:
        error(path, "no rules")


def write_promql(exprs, out):
    """Dashboard expressions as recording rules, with Grafana's variables filled in."""
    rules = []
    for i, (_, expr) in enumerate(exprs):
        expr = expr.replace("$__rate_interval", "5m").replace("$job", ".+").replace("$instance", ".+")
        rules.append({"record": f"dashboard:expr_{i}", "expr": expr})
    with open(out, "w", encoding="utf-8") as f:
        yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}, f)


def main():
    root, promql_out = sys.argv[1], sys.argv[2]
    kinds = load_spec(root)
    check_compose(root)
    exprs = check_dashboard(root, kinds)
    check_alerts(root, kinds)
    write_promql(exprs, promql_out)
    for e in errors:
        print(f"error: {e}", file=sys.stderr)
    if errors:
        sys.exit(1)
    print(f"ok: {len(kinds)} metrics in the spec, {len(exprs)} dashboard queries, alerts and compose checked")


if __name__ == "__main__":
    main()
