"""The feature decision from discovery documents recorded from real API servers
(``hack/record_discovery.py``; ``tests/fixtures/discovery/<version>/``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from driver.kube.features import LOSSES, ServerFeatures, decide, kept_fields, probe_outcome

FIXTURES = Path(__file__).resolve().parents[3] / "fixtures" / "discovery"


def recorded(
    name: str,
) -> tuple[dict[str, Any], dict[str, dict[str, Any]], dict[str, Any], dict[str, Any]]:
    d = FIXTURES / name
    group = json.loads((d / "group.json").read_text())
    versions = {
        v["version"]: json.loads((d / f"{v['version']}.json").read_text())
        for v in group["versions"]
    }
    return (
        json.loads((d / "version.json").read_text()),
        versions,
        json.loads((d / "probe.json").read_text()),
        json.loads((d / "probe-fields.json").read_text()),
    )


def features_of(name: str) -> ServerFeatures:
    version, docs, probe, fields = recorded(name)
    return decide(
        version,
        docs,
        probe_outcome(probe["status"], probe["body"]),
        kept_fields(fields["status"], fields["body"]),
    )


# (recorded server, slice layout, DeviceTaintRule version, features unavailable)
EXPECTED = {
    "1.37": ("split", "v1", set()),
    "1.37-gates-off": (
        "none",
        "v1",
        {"partitionable-devices", "device-taints", "consumable-capacity"},
    ),
    "1.36": ("split", "v1beta2", set()),
    "1.35": ("split", "v1alpha3", set()),
    "1.34": ("combined", "v1alpha3", set()),
    # 1.34 with its default gates (every DRA feature Tranche needs beyond the core is alpha
    # and off); recorded with --runtime-config=resource.k8s.io/v1alpha3=true still set.
    "1.34-defaults": (
        "none",
        "v1alpha3",
        {"partitionable-devices", "device-taints", "consumable-capacity"},
    ),
}


@pytest.mark.parametrize(
    "server", sorted(n for n in EXPECTED if (FIXTURES / n / "version.json").exists())
)
def test_recorded_servers_give_the_layout_and_taint_rule_version_they_accept(server: str) -> None:
    layout, rules, off = EXPECTED[server]
    f = features_of(server)
    assert (f.slice_layout, f.taint_rule_version, set(f.unavailable)) == (layout, rules, off)
    assert f.resource_v1
    assert f.server_version.startswith("v" + server.split("-", maxsplit=1)[0])
    assert f.max_device_taints == (4 if server.startswith("1.34") else 16)
    assert f.taint_effect_none == (not server.startswith("1.34"))
    assert f.max_slice_device_counters == (1024 if server.startswith("1.34") else None)


def test_a_server_with_dra_gates_off_says_what_users_lose() -> None:
    f = features_of("1.37-gates-off")
    assert "no dynamic MIG placements" in f.unavailable["partitionable-devices"]
    assert "unhealthy GPU" in f.unavailable["device-taints"]
    assert "no time-slice/MPS share devices" in f.unavailable["consumable-capacity"]
    assert not f.device_taints and not f.consumable_capacity
    assert f.log_lines()[0] == (
        f"feature unavailable feature=partitionable-devices "
        f"loss={LOSSES['partitionable-devices']!r}"
    )


def test_a_server_without_resource_v1_or_taint_rules_names_both() -> None:
    version, _, _, _ = recorded("1.37")
    no_v1 = {"v1beta2": {"resources": [{"name": "resourceslices"}]}}
    f = decide(version, no_v1, None)
    assert not f.resource_v1
    assert set(f.unavailable) == {"resource-v1", "partitionable-devices", "device-taint-rules"}
    assert not f.device_taints
    assert "Kubernetes >= 1.34" in f.unavailable["resource-v1"]
    assert f.taint_rule_version is None


def test_the_newest_taint_rule_version_wins() -> None:
    docs = {
        "v1alpha3": {"resources": [{"name": "devicetaintrules"}]},
        "v1beta2": {
            "resources": [{"name": "devicetaintrules"}, {"name": "devicetaintrules/status"}]
        },
        "v1": {"resources": [{"name": "resourceslices"}]},
    }
    f = decide({"gitVersion": "v1.36.3"}, docs, "combined-refused")
    assert f.taint_rule_version == "v1beta2"


@pytest.mark.parametrize(
    ("version", "limit"),
    [
        ({"major": "1", "minor": "34+", "gitVersion": "v1.34.4-gke.1"}, 4),
        ({"major": "1", "minor": "35"}, 16),
        ({"gitVersion": "v1.37.2"}, 16),
        ({"gitVersion": "v1.34.0"}, 4),
        ({}, 4),  # unknown: the smaller limit, which every server accepts
    ],
)
def test_the_device_taint_limit_follows_the_server_version(
    version: dict[str, str], limit: int
) -> None:
    assert decide(version, {}, None).max_device_taints == limit


@pytest.mark.parametrize(
    ("version", "limit"),
    [
        ({"major": "1", "minor": "34+", "gitVersion": "v1.34.4-gke.1"}, 1024),
        ({"major": "1", "minor": "35"}, None),
        ({"gitVersion": "v1.37.2"}, None),
        ({}, 1024),  # unknown: the 1.34 limit, which every server accepts
    ],
)
def test_the_per_slice_counter_limit_exists_on_kubernetes_1_34_only(
    version: dict[str, str], limit: int | None
) -> None:
    """1.34 refuses a slice whose devices consume more than 1024 counters together
    (ResourceSliceMaxDeviceCountersPerSlice); 1.35 moved counters out and dropped it."""
    assert decide(version, {}, None).max_slice_device_counters == limit


def test_probe_answers_are_classified() -> None:
    kept = {"spec": {"sharedCounters": [{"name": "p"}], "devices": [{"consumesCounters": [{}]}]}}
    assert probe_outcome(201, kept) == "combined-kept"
    assert probe_outcome(422, {}) == "combined-refused"
    assert probe_outcome(201, {"spec": {"devices": [{"name": "probe"}]}}) == "fields-dropped"
