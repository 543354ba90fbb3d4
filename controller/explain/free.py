"""What the cluster could place now (pure): free whole GPUs, NVLink domains, MIG placements.

A device is free when no claim holds it, no NoSchedule/NoExecute taint is on it, and
its GPU's counters still have room for it (no MIG neighbour, whole GPU or share of
the same GPU overlaps it). MIG placements are counted one at a time: two free
placements of one GPU may overlap each other.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from controller.explain.funnel import BLOCKING_EFFECTS, charged, counters_fit
from controller.explain.model import Device, Inventory, Json, Usage

SIZES = (1, 2, 4, 8)


@dataclass(frozen=True)
class GpuFree:
    gpu: str
    product: str
    whole_free: bool
    placements: tuple[tuple[str, int], ...]  # (profile, start) of each free MIG placement

    def profile_counts(self) -> dict[str, int]:
        return dict(Counter(p for p, _ in self.placements))


@dataclass(frozen=True)
class NodeFree:
    node: str
    gpus: tuple[GpuFree, ...]
    free_gpus: int
    total_gpus: int
    domains: tuple[tuple[str, int], ...]  # (nvlinkDomain or GPU name, free GPUs), largest first

    @property
    def largest_domain(self) -> int:
        return self.domains[0][1] if self.domains else 0

    def claims_of(self, size: int, nvlink: bool) -> int:
        if nvlink:
            return sum(n // size for _, n in self.domains)
        return self.free_gpus // size


@dataclass(frozen=True)
class FreeView:
    nodes: tuple[NodeFree, ...]

    def claims(self, size: int, nvlink: bool = False) -> int:
        return sum(n.claims_of(size, nvlink) for n in self.nodes)

    def as_json(self) -> Json:
        return {
            "nodes": [
                {
                    "node": n.node,
                    "freeGpus": n.free_gpus,
                    "totalGpus": n.total_gpus,
                    "largestNvlinkDomain": n.largest_domain,
                    "gpus": [
                        {
                            "gpu": g.gpu,
                            "product": g.product,
                            "wholeFree": g.whole_free,
                            "freeMigPlacements": [
                                {"profile": p, "start": s} for p, s in g.placements
                            ],
                        }
                        for g in n.gpus
                    ],
                }
                for n in self.nodes
            ],
            "placeableClaims": {
                str(k): {"anyGpus": self.claims(k), "oneNvlinkDomain": self.claims(k, True)}
                for k in SIZES
            },
        }


def _free(d: Device, usage: Usage) -> bool:
    if d.key in usage.exclusive or any(t.effect in BLOCKING_EFFECTS for t in d.taints):
        return False
    return charged(d, usage) or counters_fit(d, usage.counters_left)


def _start(d: Device) -> int:
    tail = d.name.rsplit("-", 1)[-1]
    return int(tail) if tail.isdigit() else 0


def free_view(inventory: Inventory, usage: Usage, nodes: Sequence[str] | None = None) -> FreeView:
    out = []
    for node in nodes if nodes is not None else inventory.nodes:
        devices = inventory.on(node)
        wholes = [d for d in devices if d.type == "gpu" and not d.attribute("sharing")]
        migs = [d for d in devices if d.type == "mig"]
        gpus = []
        domains: Counter[str] = Counter()
        for w in wholes:
            free = _free(w, usage)
            placements = tuple(
                (m.attribute("profile") or "?", _start(m))
                for m in migs
                if m.gpu == w.gpu and _free(m, usage)
            )
            gpus.append(GpuFree(w.name, w.attribute("productName") or "", free, placements))
            if free:
                domains[w.attribute("nvlinkDomain") or w.name] += 1
        # GPUs published only as MIG slots (MIG mode on, no whole device)
        for parent in sorted({m.gpu for m in migs} - {w.gpu for w in wholes}):
            placements = tuple(
                (m.attribute("profile") or "?", _start(m))
                for m in migs
                if m.gpu == parent and _free(m, usage)
            )
            product = next((m.attribute("productName") or "" for m in migs if m.gpu == parent), "")
            gpus.append(GpuFree(parent, product, False, placements))
        out.append(
            NodeFree(
                node,
                tuple(gpus),
                sum(1 for g in gpus if g.whole_free),
                len(wholes),
                tuple(sorted(domains.items(), key=lambda kv: (-kv[1], kv[0]))),
            )
        )
    return FreeView(tuple(out))
