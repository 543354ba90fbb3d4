"""The chart's PrometheusRule renders exactly the rules of deploy/prometheus/tranche-rules.yaml.

The chart cannot read files outside its directory, so it ships a copy
(``files/prometheus/tranche-rules.yaml``; ``make rules-test`` also compares them). The
alerts on ``up`` select the job ``tranche-kubelet-plugin``, which the ServiceMonitor
names through its ``jobLabel``.
"""

from __future__ import annotations

from typing import Any

import yaml

from tests.e2e.prometheus_server import JOB, RULES
from tests.e2e.test_chart import CHART, helm, render

__all__ = ["helm"]  # the session fixture, used by this module

CHART_RULES = CHART / "files" / "prometheus" / "tranche-rules.yaml"


def _kind(objs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objs if o["kind"] == kind]


def test_chart_copy_of_the_rules_is_identical() -> None:
    assert CHART_RULES.read_bytes() == RULES.read_bytes(), f"cp {RULES} {CHART_RULES}"


def test_prometheus_rule_is_off_by_default(helm: str) -> None:
    assert _kind(render(helm, "tranche", "gpu"), "PrometheusRule") == []


def test_prometheus_rule_renders_the_rules_file_unchanged(helm: str) -> None:
    objs = render(
        helm, "tranche", "gpu",
        "--set", "prometheusRule.enabled=true",
        "--set", "prometheusRule.labels.release=kube-prometheus-stack",
    )  # fmt: skip
    (rule,) = _kind(objs, "PrometheusRule")
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["metadata"]["namespace"] == "gpu"
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert rule["spec"] == {"groups": yaml.safe_load(RULES.read_text())["groups"]}
    # Alert templates reach Prometheus as written, not expanded by Helm.
    descriptions = [
        r["annotations"]["description"] for g in rule["spec"]["groups"] for r in g["rules"]
        if "alert" in r
    ]  # fmt: skip
    assert any("{{ $labels.instance }}" in d for d in descriptions)


def test_service_monitor_names_the_job_the_alerts_select(helm: str) -> None:
    objs = render(
        helm, "tranche", "gpu",
        "--set", "serviceMonitor.enabled=true",
        "--set", "kubeletPlugin.metricsBindAddress=0.0.0.0",
        "--set-json", 'kubeletPlugin.metricsScrapers=[{"namespaceSelector": '
        '{"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]',
    )  # fmt: skip
    (monitor,) = _kind(objs, "ServiceMonitor")
    (service,) = [s for s in _kind(objs, "Service") if s["metadata"]["name"].endswith("-metrics")]
    key = monitor["spec"]["jobLabel"]
    assert service["metadata"]["labels"][key] == JOB
    assert f'up{{job="{JOB}"}}' in RULES.read_text()
    # Every Service the monitor selects names its job: none is named after the release.
    wanted = monitor["spec"]["selector"]["matchLabels"].items()
    selected = {
        s["metadata"]["name"]: s["metadata"]["labels"].get(key)
        for s in _kind(objs, "Service")
        if wanted <= s["metadata"]["labels"].items()
        and any(p["name"] == "metrics" for p in s["spec"]["ports"])
    }
    assert selected == {
        service["metadata"]["name"]: JOB,
        "tranche-controller": "tranche-controller",
    }, selected
