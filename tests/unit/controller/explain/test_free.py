"""The free view: whole GPUs, NVLink domains, MIG placements, and what could be placed."""

from __future__ import annotations

from controller.explain.free import free_view
from controller.explain.model import usage_from
from controller.explain.render import render_free
from tests.unit.controller.explain.world import allocated, cluster, h100, l4, node_slices, nvlinked

XID = {"key": "gpu.tranche.dev/xid", "value": "79", "effect": "NoSchedule"}


def test_free_gpus_domains_and_placements() -> None:
    world = cluster(
        node_slices("dgx", nvlinked(8, 8))
        + node_slices("split", nvlinked(8, 4))
        + node_slices("l4", [l4(0), l4(1)], taints={"gpu-00000001": [XID]}),
        [
            allocated("a", "mig", "dgx", ["gpu-00000000-mig-3g40gb-4"]),
            allocated("a", "two", "split", ["gpu-00000000", "gpu-00000005"]),
        ],
    )
    view = free_view(world.inventory, usage_from(world.inventory, world.claims))
    nodes = {n.node: n for n in view.nodes}
    assert (nodes["dgx"].free_gpus, nodes["dgx"].largest_domain) == (7, 7)
    assert (nodes["split"].free_gpus, nodes["split"].largest_domain) == (6, 3)
    assert (nodes["l4"].free_gpus, nodes["l4"].total_gpus) == (1, 2)  # one tainted
    gpu0 = nodes["dgx"].gpus[0]
    assert not gpu0.whole_free
    # 3g.40gb at 4 holds slices 4-7: the 4g.40gb and 3g.40gb at 0 still fit, 7g.80gb does not
    counts = gpu0.profile_counts()
    assert counts["4g.40gb"] == 1 and counts["3g.40gb"] == 1 and "7g.80gb" not in counts
    assert counts["1g.10gb"] == 4
    assert [(k, view.claims(k), view.claims(k, True)) for k in (1, 2, 4, 8)] == [
        (1, 14, 14),
        (2, 6, 5),  # split: 6 free GPUs make 3 pairs, but only 1 + 1 inside its two domains
        (4, 2, 1),
        (8, 0, 0),
    ]
    text = render_free(view)
    assert "gpu-00000000: 1g.10gbx4" in text
    assert (
        "Whole-GPU claims on one node that fit now: 1 GPU: 14 (14 within one NVLink domain)" in text
    )


def test_gpu_with_only_mig_slots() -> None:
    world = cluster(node_slices("a100", [h100(0, mig_enabled=True)]))
    view = free_view(world.inventory, usage_from(world.inventory, world.claims))
    (node,) = view.nodes
    assert node.total_gpus + len(node.gpus) >= 1
    assert view.as_json()["placeableClaims"]["1"]["anyGpus"] == node.free_gpus
