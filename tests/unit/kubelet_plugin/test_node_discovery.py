"""Discovery at start: a busy or garbled answer is waited out, only a 404 means not served."""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from driver.devices.inventory import DYNAMIC_MIG
from driver.kube.http import RawAnswer
from driver.nvml.types import XidEvent
from driver.sharing import SharingConfig
from tests.unit.kubelet_plugin.sim_plugin import sim_plugin
from tests.unit.kubelet_plugin.slice_api import SliceApi, answer

BUSY = {
    "503": answer(503, {"kind": "Status", "code": 503, "message": "unable to handle"}),
    "429": answer(429, {"kind": "Status", "code": 429, "message": "too many requests"}),
    "html": RawAnswer(200, "OK", b"<html>upgrading</html>"),
}


def once(api: SliceApi, path: str, bad: RawAnswer) -> list[str]:
    """Answer ``path`` with ``bad`` the first time it is asked; the paths asked for after."""
    asked: list[str] = []

    def override(method: str, asked_path: str) -> RawAnswer | None:
        if asked_path != path:
            return None
        asked.append(asked_path)
        return bad if len(asked) == 1 else None

    api.answers.append(override)
    return asked


@pytest.mark.parametrize("bad", sorted(BUSY))
@pytest.mark.parametrize(
    "path", ["/version", "/apis/resource.k8s.io", "/apis/scheduling.k8s.io/v1beta1"]
)
def test_one_busy_answer_to_discovery_is_waited_out(tmp_path: Path, path: str, bad: str) -> None:
    api = SliceApi()
    plugin = sim_plugin(tmp_path, api)
    asked = once(api, path, BUSY[bad])
    try:
        assert plugin._discover_when_reachable(threading.Event())
    finally:
        api.close()
    assert len(asked) == 2  # asked again after the busy answer
    features = plugin.features
    assert features is not None
    assert (features.resource_v1, features.slice_layout, features.device_taints) == (
        True,
        "split",
        True,
    )
    assert features.pod_group_version == "v1beta1"
    assert plugin.ready() == "ResourceSlices not published yet"  # not "does not serve ..."


def test_a_404_on_the_resource_group_means_not_served(tmp_path: Path) -> None:
    api = SliceApi()
    plugin = sim_plugin(tmp_path, api)
    missing = answer(404, {"message": "not found"})
    api.answers.append(lambda _m, p: missing if p == "/apis/resource.k8s.io" else None)
    try:
        assert plugin._discover_when_reachable(threading.Event())
    finally:
        api.close()
    ready = plugin.ready()
    assert ready is not None and "does not serve resource.k8s.io/v1 ResourceSlices" in ready


def server_1_34(api: SliceApi) -> None:
    """Make ``api`` a Kubernetes 1.34 server: its version, and the combined slice layout
    (counters next to the devices that consume them) kept by the layout probe."""
    v134 = answer(200, {"gitVersion": "v1.34.4", "major": "1", "minor": "34"})

    def override(method: str, path: str) -> RawAnswer | None:
        return v134 if path == "/version" else None

    api.answers.append(override)
    api.dry_run_keeps_combined = True


def refused_by_1_34(slices: list[dict[str, Any]]) -> list[str]:
    """What the 1.34 API server's validation refuses in these slices (taints and slice
    sizes): ``DeviceTaintsMaxLength`` was 4, the only effects were NoSchedule and NoExecute,
    and a slice held at most 128 devices consuming at most 1024 counters together."""
    errors = []
    for s in slices:
        devices = s["spec"].get("devices", [])
        counters = sum(len(c["counters"]) for d in devices for c in d.get("consumesCounters", []))
        if counters > 1024:
            errors.append(f"{s['metadata']['name']}.devices: Invalid value: {counters}")
        if len(devices) > 128:
            errors.append(f"{s['metadata']['name']}.devices: Too many: {len(devices)}")
        for d in s["spec"].get("devices", []):
            taints = d.get("taints", [])
            if len(taints) > 4:
                errors.append(f"{d['name']}.taints: Too many: {len(taints)}: must have at most 4")
            errors += [
                f"{d['name']}.taints.effect: Unsupported value: {t['effect']!r}"
                for t in taints
                if t["effect"] not in ("NoSchedule", "NoExecute")
            ]
    return errors


def test_a_gpu_with_many_faults_still_publishes_on_kubernetes_1_34(tmp_path: Path) -> None:
    """1.34 accepts 4 taints per device (16 from 1.35): a GPU with six faults keeps the four
    strongest, its NoExecute fault among them, instead of the server refusing the slice."""
    api = SliceApi()
    server_1_34(api)
    plugin = sim_plugin(tmp_path, api)
    try:
        features = plugin.discover_features()
    finally:
        api.close()
    assert (features.slice_layout, features.max_device_taints) == ("combined", 4)
    plugin.desired_slices()  # the health monitor learns the devices
    gpu = plugin.inventory.gpus[0]
    for xid in (46, 74, 109, 119, 120, 48):  # five resets (NoSchedule), one double-bit ECC
        plugin.health.observe_event(XidEvent(gpu.info.uuid, "xid", xid, 1.0e9))
    slices = plugin.desired_slices()
    assert refused_by_1_34(slices) == []
    (device,) = [d for s in slices for d in s["spec"].get("devices", []) if d["name"] == gpu.name]
    assert len(device["taints"]) == 4
    assert {"key": "gpu.tranche.dev/xid", "value": "48", "effect": "NoExecute"} in [
        {k: t[k] for k in ("key", "value", "effect")} for t in device["taints"]
    ]


@pytest.mark.parametrize("server", ["1.34", "1.37"])
def test_informational_taints_are_left_out_where_the_server_refuses_them(
    tmp_path: Path, server: str
) -> None:
    """Effect ``None`` exists from 1.35: on 1.34 an informational fault (here XID 63, a row
    remap) must not make the server refuse the node's slices; stronger taints stay."""
    api = SliceApi()
    if server == "1.34":
        server_1_34(api)
    plugin = sim_plugin(tmp_path, api)
    try:
        plugin.discover_features()
    finally:
        api.close()
    plugin.desired_slices()
    gpu = plugin.inventory.gpus[0]
    for xid in (63, 48):  # informational (None), double-bit ECC (NoExecute)
        plugin.health.observe_event(XidEvent(gpu.info.uuid, "xid", xid, 1.0e9))
    slices = plugin.desired_slices()
    (device,) = [d for s in slices for d in s["spec"].get("devices", []) if d["name"] == gpu.name]
    effects = sorted(t["effect"] for t in device["taints"])
    if server == "1.34":
        assert refused_by_1_34(slices) == []
        assert effects == ["NoExecute"]
    else:
        assert effects == ["NoExecute", "None"]


def test_many_sharing_groups_leave_out_the_shares_that_do_not_fit_on_kubernetes_1_34(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """An H100 with dynamic MIG and 30 sharing groups (time-slicing and MPS) consumed more
    than the 1024 counters 1.34 allows per slice, and the server refused every GPU's slice.
    Now the groups that do not fit are left out, and the node says so once."""
    api = SliceApi()
    server_1_34(api)
    groups = tuple(f"team-{i:02d}" for i in range(30))
    registry = CollectorRegistry()
    plugin = sim_plugin(
        tmp_path,
        api,
        advertise=DYNAMIC_MIG,
        sharing=SharingConfig(groups=groups),
        registry=registry,
    )
    events: list[tuple[str, str, str]] = []
    monkeypatch.setattr(
        plugin.events,
        "record",
        lambda _obj, kind, reason, message: events.append((kind, reason, message)),
    )
    try:
        features = plugin.discover_features()
    finally:
        api.close()
    assert features.max_slice_device_counters == 1024
    with caplog.at_level(logging.WARNING):
        plugin.republish()
        slices = plugin.desired_slices()  # a second build changes nothing: nothing said again
    assert refused_by_1_34(slices) == []
    names = {d["name"] for s in slices for d in s["spec"].get("devices", [])}
    gpus = plugin.inventory.gpus
    for gpu in gpus:
        assert set(plugin.inventory.devices_on(gpu.name)) <= names
        assert f"{gpu.name}-mps-team-26" in names and f"{gpu.name}-ts-team-26" in names
        assert f"{gpu.name}-ts-team-27" not in names
    lines = [r.getMessage() for r in caplog.records if "share devices left out" in r.getMessage()]
    assert len(lines) == len(gpus)
    assert f"gpu={gpus[0].name} groups=team-27,team-28,team-29 limit=1024" in lines[0]
    assert [(k, r) for k, r, _ in events] == [("Warning", "SharesNotPublished")] * len(gpus)
    assert "team-27, team-28, team-29" in events[0][2]
    left_out = registry.get_sample_value("tranche_unpublished_share_devices")
    assert left_out == 3 * 2 * len(gpus)  # three groups, two mechanisms, every GPU
