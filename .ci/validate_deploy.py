#!/usr/bin/env python3
"""Checks of the deploy files that no off-the-shelf validator makes; run by .ci/validate-deploy.

- docker-compose.yml: durations in Go's syntax (what Docker Compose parses; docker-compose 1.29
  and the JSON schema accept any string), and every bind-mounted source file exists.
- deploy/grafana/ferry-dashboard.json: valid JSON, unique panel ids, the `${DS_PROMETHEUS}` input,
  and every `ferry_*` name a metric of the telemetry spec (histogram suffixes on histograms only).
- deploy/prometheus/ferry-alerts.yml: valid YAML, and the same metric-name rule.
- deploy/kubernetes/: what the schemas (kubernetes-validate, run by .ci/validate-deploy) cannot
  see: the kustomization lists every manifest; the Deployment's ConfigMap, Secret and Service
  references resolve; ferry.toml in the ConfigMap is TOML whose *_password_file paths are keys of
  the mounted Secret; probes on /healthz and /readyz; enableServiceLinks off; non-root, read-only
  root; the drain fits the grace period; the ServiceMonitor (a CRD, no schema) selects the Service
  and yields job="ferry", which the alerts select; no PodDisruptionBudget (deploy/README.md).
- Every PromQL expression of the dashboard is written to a rule file (PROMQL_OUT) so that
  `promtool check rules` parses it.

The telemetry spec is read from crates/ferry/src/telemetry/metrics.rs: the `pub const NAME: &str =
"ferry_..."` constants and the `spec(NAME, C|G|H, ...)` entries of `SPEC`.
Usage: validate_deploy.py REPO_ROOT PROMQL_OUT
"""

import glob
import json
import os
import re
import sys
import tomllib

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


def check_monitoring_profile(root):
    """The compose monitoring profile scrapes Ferry under the job the alerts select."""
    path = os.path.join(root, "deploy/prometheus/prometheus.yml")
    doc = yaml.safe_load(open(path, encoding="utf-8"))
    jobs = [j.get("job_name") for j in doc.get("scrape_configs", [])]
    if "ferry" not in jobs:
        error(path, f"no scrape job named ferry (jobs: {jobs}); the alert rules select job=\"ferry\"")
    ds = os.path.join(root, "deploy/grafana/provisioning/datasources/prometheus.yml")
    sources = yaml.safe_load(open(ds, encoding="utf-8")).get("datasources", [])
    if not any(d.get("type") == "prometheus" and d.get("isDefault") for d in sources):
        error(ds, "no default Prometheus data source: the dashboard's DS_PROMETHEUS picks the default")


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
    variables = dash.get("templating", {}).get("list", [])
    if not any(v.get("name") == "DS_PROMETHEUS" and v.get("type") == "datasource" for v in variables):
        error(path, "no datasource variable DS_PROMETHEUS: a provisioned dashboard (the compose "
              "monitoring profile) cannot resolve ${DS_PROMETHEUS} without it")
    for var in variables:
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


def parse_duration_s(value):
    """Ferry's durations ("30s", "500ms", "2m") in seconds."""
    m = re.fullmatch(r"([0-9]+)(ms|s|m|h)", str(value))
    if not m:
        return None
    return int(m.group(1)) * {"ms": 0.001, "s": 1, "m": 60, "h": 3600}[m.group(2)]


def check_kubernetes(root):
    kdir = os.path.join(root, "deploy/kubernetes")
    kust_path = os.path.join(kdir, "kustomization.yaml")
    kust = yaml.safe_load(open(kust_path, encoding="utf-8"))
    files = sorted(os.path.basename(f) for f in glob.glob(os.path.join(kdir, "*.yaml")))
    listed = kust.get("resources") or []
    for f in files:
        if f != "kustomization.yaml" and f not in listed:
            error(kust_path, f"{f} is not in resources")
    for f in listed:
        if f not in files:
            error(kust_path, f"resource {f} does not exist")
    objs = {}
    for f in files:
        if f == "kustomization.yaml":
            continue
        for doc in yaml.safe_load_all(open(os.path.join(kdir, f), encoding="utf-8")):
            if doc:
                objs[(doc["kind"], doc["metadata"]["name"])] = (f, doc)
    by_kind = lambda kind: [(n, fd) for (k, n), fd in objs.items() if k == kind]
    if by_kind("PodDisruptionBudget"):
        error(kdir, "a PodDisruptionBudget would block evicting the active instance forever "
              "(the standby is never ready): see deploy/README.md")
    deployments = by_kind("Deployment")
    if len(deployments) != 1:
        error(kdir, f"expected one Deployment, found {len(deployments)}")
        return
    _, (dfile, dep) = deployments[0]
    where = f"{kdir}/{dfile}"
    spec = dep["spec"]
    pod = spec["template"]["spec"]
    pod_labels = spec["template"]["metadata"].get("labels", {})
    if spec.get("replicas") != 2:
        error(where, "replicas should be 2: an active and a hot standby")
    if pod.get("enableServiceLinks") is not False:
        error(where, "enableServiceLinks must be false: service links inject FERRY_* variables")
    psc = pod.get("securityContext", {})
    if not psc.get("runAsNonRoot"):
        error(where, "pod securityContext.runAsNonRoot must be true")
    (container,) = pod["containers"]
    csc = container.get("securityContext", {})
    if not csc.get("readOnlyRootFilesystem") or csc.get("allowPrivilegeEscalation") is not False:
        error(where, "container must have a read-only root and no privilege escalation")
    port_names = {p["name"]: p["containerPort"] for p in container.get("ports", [])}
    for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
        got = container.get(probe, {}).get("httpGet", {})
        if got.get("path") != path:
            error(where, f"{probe} must GET {path}, not {got.get('path')}")
        if got.get("port") not in port_names and got.get("port") not in port_names.values():
            error(where, f"{probe} port {got.get('port')} is not a container port")
    mounts = {m["name"]: m for m in container.get("volumeMounts", [])}
    config_text, secret_keys, secret_dir = None, None, None
    for vol in pod.get("volumes", []):
        mount = mounts.get(vol["name"])
        if mount is None:
            error(where, f"volume {vol['name']} is not mounted")
            continue
        if "configMap" in vol:
            ref = ("ConfigMap", vol["configMap"]["name"])
            if ref not in objs:
                error(where, f"ConfigMap {ref[1]} is not defined")
                continue
            data = objs[ref][1].get("data", {})
            key = mount.get("subPath")
            if key not in data:
                error(where, f"ConfigMap {ref[1]} has no key {key}")
                continue
            config_text = data[key]
            config_path = mount["mountPath"]
        if "secret" in vol:
            ref = ("Secret", vol["secret"]["secretName"])
            if ref not in objs:
                error(where, f"Secret {ref[1]} is not defined")
                continue
            sec = objs[ref][1]
            secret_keys = set(sec.get("stringData", {})) | set(sec.get("data", {}))
            secret_dir = mount["mountPath"].rstrip("/")
    if config_text is None:
        error(where, "no ferry.toml mounted from a ConfigMap")
        return
    if container.get("args", [])[-2:] != ["--config", config_path]:
        error(where, f"args should end with --config {config_path}")
    try:
        conf = tomllib.loads(config_text)
    except tomllib.TOMLDecodeError as e:
        error(where, f"ferry.toml in the ConfigMap is not TOML: {e}")
        return
    files = [("postgres.password_file", conf.get("postgres", {}).get("password_file"))]
    files += [(f"kafka.property_files.{name!r}", path)
              for name, path in conf.get("kafka", {}).get("property_files", {}).items()]
    for key, path in files:
        if path is None:
            continue
        if secret_dir is None or os.path.dirname(path) != secret_dir:
            error(where, f"{key} = {path} is not in the mounted Secret ({secret_dir})")
        elif os.path.basename(path) not in secret_keys:
            error(where, f"{key} = {path}: the Secret has no key {os.path.basename(path)}")
    if "sasl.password" in conf.get("kafka", {}).get("properties", {}):
        error(where, "sasl.password in the ConfigMap: use kafka.property_files")
    if re.search(r"://[^/@:]+:[^/@]+@", conf.get("postgres", {}).get("url", "")):
        error(where, "a password in postgres.url in the ConfigMap: use postgres.password_file")
    listen = conf.get("http", {}).get("listen", "127.0.0.1:9187")
    if listen.startswith("127.") or listen == "off":
        error(where, f"http.listen = {listen}: probes and Prometheus cannot reach it")
    elif int(listen.rsplit(":", 1)[1]) not in port_names.values():
        error(where, f"http.listen = {listen} is not the container port")
    drain = parse_duration_s(conf.get("shutdown", {}).get("drain_timeout", "30s"))
    grace = pod.get("terminationGracePeriodSeconds", 30)
    if drain is None or drain >= grace:
        error(where, f"shutdown.drain_timeout must be below terminationGracePeriodSeconds ({grace})")
    services = by_kind("Service")
    for name, (sfile, svc) in services:
        swhere = f"{kdir}/{sfile}"
        sel = svc["spec"].get("selector", {})
        if any(pod_labels.get(k) != v for k, v in sel.items()):
            error(swhere, f"selector {sel} does not select the Deployment's pods")
        if not svc["spec"].get("publishNotReadyAddresses"):
            error(swhere, "publishNotReadyAddresses must be true, or the standby is never scraped")
        for p in svc["spec"]["ports"]:
            if p.get("targetPort") not in port_names and p.get("targetPort") not in port_names.values():
                error(swhere, f"targetPort {p.get('targetPort')} is not a container port")
    for name, (mfile, mon) in by_kind("ServiceMonitor"):
        mwhere = f"{kdir}/{mfile}"
        want = mon["spec"]["selector"].get("matchLabels", {})
        matched = [svc for _, (_, svc) in services
                   if all(svc["metadata"].get("labels", {}).get(k) == v for k, v in want.items())]
        if len(matched) != 1:
            error(mwhere, f"selector {want} matches {len(matched)} Services, not 1")
            continue
        svc = matched[0]
        svc_ports = {p.get("name") for p in svc["spec"]["ports"]}
        for ep in mon["spec"].get("endpoints", []):
            if ep.get("port") not in svc_ports:
                error(mwhere, f"endpoint port {ep.get('port')} is not a port of {svc['metadata']['name']}")
        job = svc["metadata"].get("labels", {}).get(mon["spec"].get("jobLabel", ""))
        if job != "ferry":
            error(mwhere, f"job label would be {job!r}; the alerts and the dashboard select job=\"ferry\"")


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
    check_kubernetes(root)
    check_monitoring_profile(root)
    write_promql(exprs, promql_out)
    for e in errors:
        print(f"error: {e}", file=sys.stderr)
    if errors:
        sys.exit(1)
    print(f"ok: {len(kinds)} metrics in the spec, {len(exprs)} dashboard queries, alerts, compose and Kubernetes manifests checked")


if __name__ == "__main__":
    main()
