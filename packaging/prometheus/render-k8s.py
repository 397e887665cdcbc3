#!/usr/bin/env python3
"""Write packaging/k8s/prometheus/ from infermux-rules.yml: the rules as a ConfigMap (for a Prometheus
that reads rule files) and as a PrometheusRule (for the Prometheus Operator).

    python3 packaging/prometheus/render-k8s.py          # after editing infermux-rules.yml

tests/system/test_deployment.py fails while the manifests and the rules differ.
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
RULES = HERE / "infermux-rules.yml"
OUT = HERE.parent / "k8s" / "prometheus"
# Where the rules go: the namespace of your Prometheus (kube-prometheus and most charts: monitoring).
NAMESPACE = "monitoring"

CONFIGMAP = """\
# infermux's Prometheus rules (packaging/prometheus/infermux-rules.yml) for a Prometheus that reads
# rule files: mount this ConfigMap in its pod (e.g. at /etc/prometheus/rules/infermux) and add
#   rule_files: [/etc/prometheus/rules/infermux/*.yml]
# to its configuration. With the Prometheus Operator, apply prometheusrule.yaml instead.
# Written by packaging/prometheus/render-k8s.py; edit the rules there, not here.
apiVersion: v1
kind: ConfigMap
metadata:
  name: infermux-prometheus-rules
  namespace: {namespace}
  labels:
    app.kubernetes.io/name: infermux
data:
  infermux-rules.yml: |
{rules}"""

PROMETHEUSRULE = """\
# infermux's Prometheus rules (packaging/prometheus/infermux-rules.yml) for the Prometheus Operator.
# Its Prometheus picks rules by its ruleSelector: kube-prometheus-stack wants the label
# `release: <your Helm release>` added below. Without the Operator, apply configmap-rules.yaml instead.
# Written by packaging/prometheus/render-k8s.py; edit the rules there, not here.
apiVersion: monitoring.coreos.com/v1
kind: PrometheusRule
metadata:
  name: infermux
  namespace: {namespace}
  labels:
    app.kubernetes.io/name: infermux
spec:
{groups}"""


def _indent(text: str, by: int) -> str:
    return "".join((" " * by + line if line.strip() else line) for line in text.splitlines(keepends=True))


def manifests() -> dict[str, str]:
    """File name under packaging/k8s/prometheus -> its text."""
    text = RULES.read_text()
    groups = text[text.index("\ngroups:\n") + 1:]  # the rules without the file's header comment
    return {"configmap-rules.yaml": CONFIGMAP.format(namespace=NAMESPACE, rules=_indent(text, 4)),
            "prometheusrule.yaml": PROMETHEUSRULE.format(namespace=NAMESPACE, groups=_indent(groups, 2))}


def main() -> int:
    OUT.mkdir(exist_ok=True)
    for name, text in manifests().items():
        (OUT / name).write_text(text)
        print(f"wrote {OUT / name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
