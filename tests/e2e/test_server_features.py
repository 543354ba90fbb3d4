"""The plugin adapts to the API server it finds (discovery at start), on every version of
the matrix: the slice layout the server accepts, its slice limits and the DeviceTaintRule
version it serves."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from driver.kube.client import RESOURCE_V1
from driver.kube.features import ServerFeatures
from tests.e2e.cluster_state import get_json
from tests.e2e.sim_nodes import DYNAMIC_MIG_ARGS, PluginNode
from tests.waiting import wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.matrix]

# Verified against each release's pkg/apis/resource/validation and storage_resource.go,
# with the gates and runtime-config hack/devcluster passes for that release.
EXPECTED = {
    "1.34": ("combined", "v1alpha3"),
    "1.35": ("split", "v1alpha3"),
    "1.36": ("split", "v1beta2"),
    "1.37": ("split", "v1"),
}


def test_discovery_finds_the_layout_and_taint_rule_version_of_this_server(
    server_features: ServerFeatures, k8s_version: str
) -> None:
    f = server_features
    assert (f.slice_layout, f.taint_rule_version) == EXPECTED[k8s_version]
    assert f.server_version.startswith(f"v{k8s_version}.")
    assert dict(f.unavailable) == {}
    assert f.pod_group_version is None, "the Workload API is off by default"


def test_the_plugin_publishes_mig_placements_in_the_layout_it_discovered(
    sim_node: Callable[..., PluginNode], k8s_version: str
) -> None:
    """With 30 sharing groups as well: on 1.34 each H100's slice (dynamic MIG, time-slicing
    and MPS) would consume more than the 1024 counters the server allows per slice, and the
    server refused every GPU's slice; now the groups that do not fit are left out and said."""
    layout, rules = EXPECTED[k8s_version]
    groups = [f"team-{i:02d}" for i in range(30)]
    pn = sim_node(
        profile="dgx-h100",
        extra_args=(*DYNAMIC_MIG_ARGS, "--sharing", json.dumps({"groups": groups})),
    )
    line = wait_for(
        "the plugin's discovery log line",
        lambda: next(
            (x for x in pn.node.log_path.read_text().splitlines() if "api server features" in x),
            None,
        ),
    )
    assert f"slice_layout={layout}" in line and f"taint_rule_version={rules}" in line
    assert "unavailable=none" in line
    assert "pod_group_version=none" in line
    # the start names the API version that claims reserved for a PodGroup would need
    assert wait_for(
        "the workload-claims log line",
        lambda: next(
            (x for x in pn.node.log_path.read_text().splitlines() if "workload claims" in x),
            None,
        ),
    )

    def published() -> list[dict[str, Any]] | None:
        # The pool is written slice by slice: wait for all of it (one slice per GPU, and the
        # counter slices in the split layout), not for the first.
        items = get_json(pn.api, f"{RESOURCE_V1}/resourceslices").get("items", [])
        found = [s for s in items if s["spec"].get("nodeName") == pn.name]
        if not found or len(found) < found[0]["spec"]["pool"]["resourceSliceCount"]:
            return None
        return found

    slices = wait_for("the node's whole pool of slices", published)
    migs = [d for s in slices for d in s["spec"].get("devices", []) if "-mig-" in d["name"]]
    assert migs and all(d.get("consumesCounters") for d in migs)
    together = [s for s in slices if "sharedCounters" in s["spec"] and "devices" in s["spec"]]
    assert bool(together) == (layout == "combined")
    devices = [d for s in slices for d in s["spec"].get("devices", [])]
    shares = {d["name"] for d in devices if "-ts-" in d["name"]}
    gpus = {
        d["name"]
        for d in devices
        if d["attributes"]["type"]["string"] == "gpu" and not d.get("allowMultipleAllocations")
    }
    kept = {name.rsplit("-ts-", 1)[1] for name in shares}
    left_out = [
        x for x in pn.node.log_path.read_text().splitlines() if "share devices left out" in x
    ]
    if k8s_version == "1.34":  # 1024 counters per slice: 27 groups fit beside dynamic MIG
        assert kept == set(groups[:27]) and len(shares) == 27 * len(gpus)
        assert len(left_out) == len(gpus) and "groups=team-27,team-28,team-29" in left_out[0]
    else:
        assert kept == set(groups) and not left_out
