"""The build-only Go modules that stand beside the control plane (the Go DRA test driver of the
benchmarks, the kubelet's gRPC client) are pinned to the release the dev cluster runs by
default. Bumping ``hack/k8sbin/go.mod`` alone would leave the benchmarks comparing Tranche with
another release's kubelet plugin helper, and the kubelet client on another release's stubs."""

from __future__ import annotations

import re
from pathlib import Path

from hack.devcluster.config import K8S_VERSIONS

HACK = Path(__file__).resolve().parents[3] / "hack"
RELEASE = K8S_VERSIONS["1.37"]  # the default minor of hack/k8s-versions.sh
STAGING = "v0." + RELEASE.removeprefix("v1.")  # v1.37.2 -> v0.37.2


def _k8s_pins(go_mod: Path | str) -> dict[str, set[str]]:
    """Each k8s.io module a go.mod (a path, or its text) requires or replaces, with every
    version it names."""
    text = go_mod.read_text() if isinstance(go_mod, Path) else go_mod
    pins: dict[str, set[str]] = {}
    for raw in text.splitlines():
        target = raw.split("//")[0].split("=>")[-1].strip()  # "k8s.io/api => k8s.io/api v0.37.2"
        match = re.fullmatch(r"(?:require\s+)?(k8s\.io/[\w./-]+)\s+(v\S+)", target)
        if match:
            pins.setdefault(match.group(1), set()).add(match.group(2))
    return pins


def test_the_default_release_is_the_control_plane_module() -> None:
    assert _k8s_pins(HACK / "k8sbin" / "go.mod")["k8s.io/kubernetes"] == {RELEASE}


def test_the_go_test_driver_is_built_from_the_control_planes_release() -> None:
    pins = _k8s_pins(HACK / "dratestdriver" / "go.mod")
    assert pins["k8s.io/kubernetes"] == {RELEASE}
    # Every k8s.io module both name (staging modules, required as v0.0.0 and replaced by the
    # release's tag; klog, utils, kube-openapi at the release's pins) at the same versions.
    control_plane = _k8s_pins(HACK / "k8sbin" / "go.mod")
    differ = {
        m: (pins[m], control_plane[m])
        for m in pins.keys() & control_plane.keys()
        if pins[m] != control_plane[m]
    }
    assert not differ, f"hack/dratestdriver/go.mod and hack/k8sbin/go.mod differ: {differ}"
    for staging in ("k8s.io/api", "k8s.io/dynamic-resource-allocation", "k8s.io/kubelet"):
        assert STAGING in pins[staging], staging
    # The build recipe (part of the binary's cache key) and the bench's prose name it too.
    assert f"k8s={RELEASE}" in (HACK / "build-dra-test-driver.sh").read_text()
    assert f"`k8s.io/kubernetes` {RELEASE}" in (HACK / "bench" / "go_driver.py").read_text()


def test_the_kubelet_client_uses_the_real_kubelets_stubs() -> None:
    assert _k8s_pins(HACK / "kubeletclient" / "go.mod")["k8s.io/kubelet"] == {STAGING}


def test_a_bumped_staging_module_is_found() -> None:
    """The parser reads the lines a bump changes (guards the guard)."""
    go_mod = (HACK / "dratestdriver" / "go.mod").read_text()
    bumped = go_mod.replace(
        f"k8s.io/kubelet => k8s.io/kubelet {STAGING}", "k8s.io/kubelet => k8s.io/kubelet v0.99.0"
    )
    assert "v0.99.0" in _k8s_pins(bumped)["k8s.io/kubelet"]
    assert "v0.99.0" not in _k8s_pins(go_mod)["k8s.io/kubelet"]
