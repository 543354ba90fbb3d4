"""Which kubelet a real node may run, and the feature gates it is started with."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from hack.devcluster.config import VERSION_GATES
from hack.devcluster.errors import ClusterError
from hack.devcluster.realnode.kubelet_version import cluster_minor, kubelet_gates, kubelet_release


def test_a_kubelet_of_the_clusters_release_gets_the_clusters_gates() -> None:
    gates = {**VERSION_GATES["1.34"], "SomeExtraGate": False}
    assert kubelet_gates("v1.34.4", "1.34", gates) == gates


def test_an_older_kubelet_gets_no_dra_gate_its_release_does_not_know() -> None:
    gates = {**VERSION_GATES["1.37"], "SomeExtraGate": True}
    got = kubelet_gates("v1.34.4", "1.37", gates)
    assert "ResourceHealthStatusMessage" not in got and "DRADeviceTaintRules" not in got
    assert got["DynamicResourceAllocation"] is True and got["SomeExtraGate"] is True
    assert set(got) - {"SomeExtraGate"} <= set(VERSION_GATES["1.34"])


def test_a_kubelet_newer_than_the_control_plane_is_refused() -> None:
    with pytest.raises(ClusterError, match=r"hack/build-node.sh --version 1.34"):
        kubelet_gates("v1.37.2", "1.34", VERSION_GATES["1.34"])


def test_a_kubelet_outside_the_matrix_is_refused() -> None:
    with pytest.raises(ClusterError, match="not in the version matrix"):
        kubelet_gates("v1.33.9", "1.34", VERSION_GATES["1.34"])


def test_the_release_is_what_kubelet_version_prints(tmp_path: Path) -> None:
    kubelet = tmp_path / "kubelet"
    kubelet.write_text("#!/bin/sh\necho 'Kubernetes v1.35.4'\n")
    kubelet.chmod(kubelet.stat().st_mode | stat.S_IXUSR)
    assert kubelet_release(tmp_path) == "v1.35.4"
    kubelet.write_text("#!/bin/sh\necho nonsense; exit 3\n")
    with pytest.raises(ClusterError, match="exited 3"):
        kubelet_release(tmp_path)


def test_the_clusters_version_is_read_from_its_state_dir(tmp_path: Path) -> None:
    assert cluster_minor(tmp_path) == "1.37"
    (tmp_path / "cluster.json").write_text('{"k8s_version": "1.35"}')
    assert cluster_minor(tmp_path) == "1.35"
