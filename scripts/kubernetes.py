#!/usr/bin/env python3
"""deploy/kubernetes: the PrometheusRule from deploy/prometheus/alerts.yml, and the validation.

    python3 scripts/kubernetes.py rules       # (re)writes deploy/kubernetes/base/prometheusrule.yaml
    python3 scripts/kubernetes.py check DIR   # DIR: each overlay rendered by `kubectl kustomize`

`rules`: the alert rules have one source, deploy/prometheus/alerts.yml (promtool checks it);
the PrometheusRule the Prometheus Operator reads carries the same groups, written here.
`check` (run by .ci/run, after `rules --diff` says the file is current) validates every object
of every rendered overlay: the Kubernetes kinds against the API schemas of Kubernetes
KUBE_VERSION (kubernetes-validate, strict: unknown fields are errors), and the
Prometheus Operator's ServiceMonitor and PrometheusRule against its published CRD schemas
(the @kubernetes-models/prometheus-operator npm package, through node). Needs PyYAML and
kubernetes-validate (pip), and node with that package installed in CRD_NODE_DIR.
"""

import json
import os
import subprocess
import sys

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ALERTS = os.path.join(ROOT, "deploy/prometheus/alerts.yml")
RULE = os.path.join(ROOT, "deploy/kubernetes/base/prometheusrule.yaml")
KUBE_VERSION = os.environ.get("KUBE_VERSION", "1.32.0")
CRD_KINDS = {"ServiceMonitor", "PrometheusRule"}

HEADER = """# Generated from deploy/prometheus/alerts.yml by `python3 scripts/kubernetes.py rules`: edit
# that file, not this one (.ci/run fails when the two differ).
"""


class Literal(yaml.SafeDumper):
    """Multi-line strings (the PromQL expressions) as literal blocks, as alerts.yml writes them."""


Literal.add_representer(
    str,
    lambda d, s: d.represent_scalar("tag:yaml.org,2002:str", s, style="|" if "\n" in s else None),
)


def rule_text():
    with open(ALERTS) as f:
        alerts = yaml.safe_load(f)
    doc = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {"name": "quotad"},
        "spec": {"groups": alerts["groups"]},
    }
    return HEADER + yaml.dump(doc, Dumper=Literal, sort_keys=False, width=100)


def rules(diff):
    text = rule_text()
    if diff:
        with open(RULE) as f:
            if f.read() != text:
                sys.exit(f"{RULE} is not what deploy/prometheus/alerts.yml makes: "
                         "run python3 scripts/kubernetes.py rules")
        print(f"{os.path.relpath(RULE, ROOT)} matches deploy/prometheus/alerts.yml")
        return
    with open(RULE, "w") as f:
        f.write(text)


NODE_CHECK = """
import * as m from "@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1";
const docs = JSON.parse(process.argv[2]);
let bad = 0;
for (const d of docs) {
  try { new m[d.kind](d).validate(); } catch (e) { bad++; console.log(d.kind + "/" + d.metadata.name + ": " + e.message); }
}
process.exit(bad ? 1 : 0);
"""


def check(directory):
    import kubernetes_validate

    errors = 0
    for name in sorted(os.listdir(directory)):
        with open(os.path.join(directory, name)) as f:
            docs = [d for d in yaml.safe_load_all(f) if d]
        crds = []
        kinds = []
        for d in docs:
            kinds.append(d["kind"])
            if d["kind"] in CRD_KINDS:
                crds.append(d)
                continue
            try:
                kubernetes_validate.validate(d, KUBE_VERSION, strict=True)
            except kubernetes_validate.ValidationError as e:
                errors += 1
                print(f"{name}: {d['kind']}/{d['metadata']['name']}: {e.message} at {list(e.path)}")
            except Exception as e:  # noqa: BLE001: a kind the schemas do not know, for one
                errors += 1
                print(f"{name}: {d['kind']}/{d['metadata']['name']}: {e}")
        if crds:
            # Beside its node_modules: ES modules resolve packages from the script's directory.
            script = os.path.join(os.environ["CRD_NODE_DIR"], "check-crds.mjs")
            with open(script, "w") as f:
                f.write(NODE_CHECK)
            r = subprocess.run(["node", script, json.dumps(crds)], capture_output=True, text=True)
            os.remove(script)
            if r.returncode != 0:
                errors += 1
                print(f"{name}: {r.stdout}{r.stderr}")
        print(f"{name}: {len(docs)} objects ({', '.join(kinds)}), Kubernetes {KUBE_VERSION}")
    if errors:
        sys.exit(f"{errors} invalid objects")
    print("every object is valid")


if __name__ == "__main__":
    if len(sys.argv) >= 2 and sys.argv[1] == "rules":
        rules("--diff" in sys.argv)
    elif len(sys.argv) == 3 and sys.argv[1] == "check":
        check(sys.argv[2])
    else:
        sys.exit(__doc__)
