"""What ``tranche explain`` finds, and what it looks at (pure data, shared by its modules).

``Reason`` (why one request does not fit on one node), ``NodeVerdict`` (one node's
answer), ``Group`` (the nodes one reason applies to), ``Recommendation`` and
``Explanation`` (the claim over all nodes); ``Context`` (the cluster as read, and the pod's
placement rules); ``STEPS``, the allocator's checks in order, which ranks how close a node
came; ``short`` for selector texts in reasons.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from controller.explain.cel import Selector
from controller.explain.model import Inventory, Json, Usage, compile_selectors
from driver.trust.policy import Tenancy

# The allocator's checks in order; a node that passed more of them is closer to fitting.
STEPS: Mapping[str, int] = {
    "node-selector": 0,
    "class": 1,
    "trust": 1,
    "selector": 2,
    "cel-error": 2,
    "taint": 3,
    "allocated": 4,
    "capacity": 4,
    "counters": 5,
    "constraint": 6,
    "combination": 6,
}


@dataclass(frozen=True)
class Reason:
    kind: str
    request: str
    summary: str  # the same text on every node it applies to: nodes are grouped by it
    detail: str = ""  # this node's particulars
    hint: str = ""  # what would make the claim fit here


@dataclass(frozen=True)
class NodeVerdict:
    node: str
    fits: bool
    reason: Reason | None = None
    devices: tuple[str, ...] = ()
    otherwise_fits: bool = False  # refused only by the pod's nodeSelector
    rank: tuple[int, float] = (0, 0.0)
    more: tuple[Reason, ...] = ()  # the first reasons of the other requests that fail here

    @property
    def reasons(self) -> tuple[Reason, ...]:
        return ((self.reason,) if self.reason else ()) + self.more


@dataclass(frozen=True)
class Group:
    kind: str
    request: str
    summary: str
    nodes: tuple[str, ...]


@dataclass(frozen=True)
class Recommendation:
    """One change to the claim (``--recommend``) and the nodes it would then fit on now."""

    change: str
    nodes: tuple[str, ...]


@dataclass(frozen=True)
class Explanation:
    claim: str
    pod: str | None
    allocated_node: str | None
    allocated_devices: tuple[str, ...]
    nodes: int
    fits: tuple[str, ...]
    groups: tuple[Group, ...]
    closest: tuple[NodeVerdict, ...]
    warnings: tuple[str, ...]
    requests: tuple[str, ...]
    recommendations: tuple[Recommendation, ...] = ()
    # for a pod with several claims: the nodes where all of them fit at once (None: one claim)
    together: tuple[str, ...] | None = None

    @property
    def state(self) -> str:
        if self.allocated_node:
            return "allocated"
        return "fits" if self.fits else "pending"

    def as_json(self) -> Json:
        return {
            "claim": self.claim,
            "pod": self.pod,
            "state": self.state,
            "allocatedNode": self.allocated_node,
            "allocatedDevices": list(self.allocated_devices),
            "nodes": self.nodes,
            "requests": list(self.requests),
            "fitsOn": list(self.fits),
            "reasons": [
                {
                    "kind": g.kind,
                    "request": g.request,
                    "summary": g.summary,
                    "count": len(g.nodes),
                    "nodes": list(g.nodes),
                }
                for g in self.groups
            ],
            "closest": [
                {
                    "node": v.node,
                    "kind": v.reason.kind if v.reason else None,
                    "summary": v.reason.summary if v.reason else None,
                    "detail": v.reason.detail if v.reason else "",
                    "hint": v.reason.hint if v.reason else "",
                }
                for v in self.closest
            ],
            "warnings": list(self.warnings),
            "fitsTogetherWithPodClaims": None if self.together is None else list(self.together),
            "recommendations": [
                {"change": r.change, "nodes": list(r.nodes)} for r in self.recommendations
            ],
        }


@dataclass
class Context:
    """Everything but the claim: the cluster as read, and the pod's placement rules."""

    inventory: Inventory
    usage: Usage
    classes: Mapping[str, Json]
    node_labels: Mapping[str, Mapping[str, str]]
    node_selector: Mapping[str, str] = field(default_factory=dict)
    # the pod's required node affinity: nodeSelectorTerms, any of which must match
    node_terms: Sequence[Json] = ()
    tenancy: Tenancy | None = None
    _class_selectors: dict[str, tuple[Selector, ...]] = field(default_factory=dict)

    def class_selectors(self, name: str) -> tuple[Selector, ...]:
        if name not in self._class_selectors:
            raw = (self.classes[name].get("spec") or {}).get("selectors") or []
            self._class_selectors[name] = compile_selectors(raw, f"DeviceClass {name}")
        return self._class_selectors[name]


def short(expression: str, limit: int = 90) -> str:
    text = " ".join(expression.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"
