"""The demo's real-node pieces that need no cluster: the fallback reason, the pods it runs
and the "container saw" column (hack/demo.py)."""

from __future__ import annotations

import os

import pytest
import yaml

from hack import demo
from hack.devcluster.realnode.render import TEST_IMAGE


def test_the_simulator_is_chosen_with_a_reason_when_asked_or_not_root(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TRANCHE_DEMO_SIMULATOR", "1")
    assert demo.real_node_unavailable() == "TRANCHE_DEMO_SIMULATOR is set"
    monkeypatch.delenv("TRANCHE_DEMO_SIMULATOR")
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    reason = demo.real_node_unavailable()
    assert reason is not None and "not root" in reason


def test_example_pods_run_the_test_image_and_print_what_they_see() -> None:
    docs = list(yaml.safe_load_all(demo.real_pods(demo.EXAMPLES)))
    pods = [d for d in docs if d["kind"] == "Pod"]
    assert {p["metadata"]["name"] for p in pods} == set(demo.pods_of(demo.EXAMPLES))
    for pod in pods:
        for c in pod["spec"]["containers"]:
            assert (c["image"], c["imagePullPolicy"]) == (TEST_IMAGE, "Never")
            assert "NVIDIA_VISIBLE_DEVICES" in c["command"][-1]
    assert any(d["kind"] == "ResourceClaimTemplate" for d in docs), "claims stay as they are"


def test_the_saw_column_shows_visible_devices_and_device_nodes() -> None:
    log = (
        "NVIDIA_VISIBLE_DEVICES=GPU-0a1b2c3d-1111-2222-3333-444455556666,GPU-99\n"
        "DEV /dev/nvidia3\nDEV /dev/nvidia5\nSHOWN\n"
    )
    assert demo.saw(log) == "GPU-0a1b2c3d,GPU-99 /dev/nvidia3 /dev/nvidia5"
    assert demo.saw("") == "(no output yet)"
