"""The fallback for clusters without the extended-resource bridge: pod rewriting.

A pod that asks for ``nvidia.com/gpu`` (or a MIG name such as
``nvidia.com/mig-1g.10gb``) in a container's resources is rewritten at
admission: the legacy resource is removed from that container's limits and
requests, the container gets a claim of its own, and the claim comes from a
ResourceClaimTemplate shared by every pod of the namespace that asks for the
same resource and count:

* pod claim ``legacy-<c|i><container index>-<resource>`` (``legacy-c0-gpu``),
* template ``tranche-legacy-<resource>-<count>`` (``tranche-legacy-gpu-2``),
  one request ``gpu`` for ``count`` devices of ``gpu.tranche.dev`` (whole GPU)
  or of ``mig.gpu.tranche.dev`` with a profile selector (MIG).

Each container gets its own devices, as the device plugin and the bridge
give them, except that an init container (no sidecar) reuses the claims of the
containers that start after it (:func:`plan_claims`). Rewritten pods carry the label
``gpu.tranche.dev/legacy-rewritten=true`` and the annotation of the same name naming
the claims made (``c0:nvidia.com/gpu=2``); the templates are created after admission,
for pods that exist (:mod:`controller.webhook.templates`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from driver.devices.bridge import LegacyResource, parse_legacy, template_request
from driver.errors import PermanentError

Json = dict[str, Any]

MANAGED_BY = "tranche-controller"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
ANNOTATION_RESOURCE = "gpu.tranche.dev/legacy-resource"
ANNOTATION_COUNT = "gpu.tranche.dev/legacy-count"
# Set on rewritten pods: the resources that were rewritten, e.g. "c0:nvidia.com/gpu=2".
ANNOTATION_REWRITTEN = "gpu.tranche.dev/legacy-rewritten"
LABEL_REWRITTEN = ANNOTATION_REWRITTEN  # "true" on rewritten pods: what the writer lists
ZERO_COUNTS = "zero counts removed"  # the annotation of a pod whose counts were all 0


class PodRejected(PermanentError):
    """The pod cannot be admitted as written; the message names the field."""


@dataclass(frozen=True)
class TemplateSpec:
    """A ResourceClaimTemplate the rewritten pod needs."""

    legacy: LegacyResource
    count: int

    @property
    def name(self) -> str:
        return f"tranche-legacy-{_label(self.legacy.short_name)}-{self.count}"

    def requests(self) -> list[Json]:
        return [template_request(self.legacy, self.count)]

    def body(self, namespace: str) -> Json:
        return {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimTemplate",
            "metadata": {
                "name": self.name,
                "namespace": namespace,
                "labels": {LABEL_MANAGED_BY: MANAGED_BY, "app.kubernetes.io/part-of": "tranche"},
                "annotations": {
                    ANNOTATION_RESOURCE: self.legacy.resource,
                    ANNOTATION_COUNT: str(self.count),
                },
            },
            "spec": {"spec": {"devices": {"requests": self.requests()}}},
        }


@dataclass(frozen=True)
class Mutation:
    """The JSON patch for the pod and the templates it refers to."""

    patch: tuple[Json, ...]
    templates: tuple[TemplateSpec, ...]
    summary: str


def _label(text: str) -> str:
    return re.sub(r"[^a-z0-9-]", "-", text.lower())


def _count(value: object, field: str) -> int:
    text = str(value).strip()
    if not re.fullmatch(r"[0-9]+", text):
        raise PodRejected(f"{field}: {text!r} is not a whole number of devices")
    return int(text)


_JSON_KINDS = {
    list: "an array",
    str: "a string",
    bool: "a boolean",
    int: "a number",
    float: "a number",
}


def _object(value: object, field: str) -> Mapping[str, Any]:
    """``value`` as a JSON object (absent: empty); anything else refuses the pod."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        kind = _JSON_KINDS.get(type(value), type(value).__name__)
        raise PodRejected(f"{field}: must be an object, not {kind}")
    return value


def _array(value: object, field: str) -> list[Any]:
    """``value`` as a JSON array (absent: empty); anything else refuses the pod."""
    if value is None:
        return []
    if not isinstance(value, list):
        kind = "an object" if isinstance(value, Mapping) else _JSON_KINDS.get(type(value), "")
        raise PodRejected(f"{field}: must be an array, not {kind or type(value).__name__}")
    return value


def _container_counts(resources: Mapping[str, Any], field: str) -> dict[str, int]:
    limits = _object(resources.get("limits"), f"{field}.limits")
    requests = _object(resources.get("requests"), f"{field}.requests")
    counts: dict[str, int] = {}
    for name in sorted(set(limits) | set(requests)):
        if parse_legacy(name) is None:
            continue
        if name in limits and name in requests:
            lim = _count(limits[name], f"{field}.limits[{name}]")
            req = _count(requests[name], f"{field}.requests[{name}]")
            if lim != req:
                raise PodRejected(
                    f"{field}: requests[{name}]={req} differs from limits[{name}]={lim}; "
                    "extended resources must be requested as limits"
                )
        source, where = (limits, "limits") if name in limits else (requests, "requests")
        counts[name] = _count(source[name], f"{field}.{where}[{name}]")
    return counts


@dataclass(frozen=True)
class Ask:
    """One container's count of one legacy resource."""

    slot: str  # the container's letter and index: "i0", "c1"
    position: int  # over initContainers, then containers
    short_lived: bool  # an init container that is no sidecar: it ends before the rest start
    count: int


def plan_claims(asks: Sequence[Ask]) -> tuple[dict[str, int], dict[str, list[str]]]:
    """The claims one legacy resource needs (by the slot naming each, with its count) and the
    claims each container uses (slot to slots), as the bridge's scheduler plans its requests
    (Kubernetes 1.37, ``createRequestsAndMappings``) and as the device plugin lets init
    containers reuse devices. Every regular and sidecar container gets a claim of its own. An
    init container that ends before them uses the claims of those that start after it, in
    order, until they hold its count; what they lack comes from one claim that all such init
    containers share (they run one after another), as large as the largest lack."""
    claims: dict[str, int] = {}
    uses: dict[str, list[str]] = {}
    long_lived = [a for a in asks if not a.short_lived]
    for a in long_lived:
        claims[a.slot] = a.count
        uses[a.slot] = [a.slot]
    lacks: dict[str, int] = {}
    for a in asks:
        if not a.short_lived:
            continue
        held = 0
        uses[a.slot] = []
        for b in long_lived:
            if b.position < a.position or held >= a.count:
                continue
            held += b.count
            uses[a.slot].append(b.slot)
        if held < a.count:
            lacks[a.slot] = a.count - held
    if lacks:
        largest = max(lacks, key=lambda slot: lacks[slot])  # the first of the largest
        claims[largest] = lacks[largest]
        for slot in lacks:
            uses[slot].append(largest)
    return claims, uses


@dataclass(frozen=True)
class _Container:
    key: str  # initContainers or containers
    index: int
    slot: str
    position: int
    short_lived: bool
    resources: Mapping[str, Any]
    counts: dict[str, int]


def _containers(spec: Mapping[str, Any]) -> list[_Container]:
    """The containers that ask for a legacy resource (a zero count included), in start order."""
    found: list[_Container] = []
    inits = _array(spec.get("initContainers"), "spec.initContainers")
    for key, letter, offset in (("initContainers", "i", 0), ("containers", "c", len(inits))):
        for index, item in enumerate(_array(spec.get(key), f"spec.{key}")):
            field = f"spec.{key}[{index}].resources"
            container = _object(item, f"spec.{key}[{index}]")
            resources = _object(container.get("resources"), field)
            counts = _container_counts(resources, field)
            if counts:
                sidecar = container.get("restartPolicy") == "Always"
                short_lived = key == "initContainers" and not sidecar
                slot = f"{letter}{index}"
                found.append(
                    _Container(key, index, slot, offset + index, short_lived, resources, counts)
                )
    return found


def _asks(containers: Sequence[_Container]) -> dict[str, list[Ask]]:
    """Per legacy resource, the non-zero counts of the containers in start order."""
    asks: dict[str, list[Ask]] = {}
    for c in containers:
        for name, count in c.counts.items():
            if count:
                asks.setdefault(name, []).append(Ask(c.slot, c.position, c.short_lived, count))
    return asks


def mutate_pod(pod: Mapping[str, Any]) -> Mutation | None:
    """The rewrite of ``pod``; None when it asks for no legacy resource. PodRejected, naming
    the field, when it cannot be admitted as written (a field of the wrong JSON type too)."""
    spec = _object(pod.get("spec"), "spec")
    old_claims = _array(spec.get("resourceClaims"), "spec.resourceClaims")
    existing = {
        _object(c, f"spec.resourceClaims[{i}]").get("name") for i, c in enumerate(old_claims)
    }
    containers = _containers(spec)
    plans = {name: plan_claims(asks) for name, asks in _asks(containers).items()}
    patch: list[Json] = []
    claims: list[Json] = list(old_claims)
    templates: dict[str, TemplateSpec] = {}
    notes: list[str] = []
    for c in containers:
        field = f"spec.{c.key}[{c.index}].resources"
        new_resources: Json = {
            part: {k: v for k, v in (c.resources.get(part) or {}).items() if k not in c.counts}
            for part in ("limits", "requests")
        }
        new_resources = {k: v for k, v in new_resources.items() if v}
        container_claims = list(_array(c.resources.get("claims"), f"{field}.claims"))
        for name in c.counts:
            if name not in plans:
                continue
            legacy = parse_legacy(name)
            assert legacy is not None
            sized, uses = plans[name]
            count = sized.get(c.slot)
            if count is not None:
                claim_name = _claim_name(c.slot, legacy)
                if claim_name in existing:
                    raise PodRejected(
                        f"spec.resourceClaims: the pod already has a claim named {claim_name!r}, "
                        f"which the rewrite of {field} ({name}) needs"
                    )
                template = TemplateSpec(legacy, count)
                templates[template.name] = template
                claims.append({"name": claim_name, "resourceClaimTemplateName": template.name})
                notes.append(f"{c.slot}:{name}={count}")
            container_claims += [{"name": _claim_name(s, legacy)} for s in uses.get(c.slot, [])]
        if container_claims:
            new_resources["claims"] = container_claims
        patch.append(
            {"op": "add", "path": f"/spec/{c.key}/{c.index}/resources", "value": new_resources}
        )
    if not patch:
        return None
    if claims != old_claims:
        patch.append({"op": "add", "path": "/spec/resourceClaims", "value": claims})
    summary = ",".join(notes) or ZERO_COUNTS
    meta = _object(pod.get("metadata"), "metadata")
    patch.append(_add_to_map(meta, "annotations", ANNOTATION_REWRITTEN, summary))
    if templates:
        patch.append(_add_to_map(meta, "labels", LABEL_REWRITTEN, "true"))
    return Mutation(patch=tuple(patch), templates=tuple(templates.values()), summary=summary)


def _claim_name(slot: str, legacy: LegacyResource) -> str:
    return f"legacy-{slot}-{_label(legacy.short_name)}"


def _add_to_map(meta: Mapping[str, Any], field: str, key: str, value: str) -> Json:
    """A JSON-patch op that sets ``metadata.<field>[key]``, creating the map when absent."""
    _object(meta.get(field), f"metadata.{field}")
    if meta.get(field) is None:
        return {"op": "add", "path": f"/metadata/{field}", "value": {key: value}}
    path = f"/metadata/{field}/" + key.replace("~", "~0").replace("/", "~1")
    return {"op": "add", "path": path, "value": value}


def templates_of(summary: str) -> tuple[TemplateSpec, ...]:
    """The templates a rewritten pod's annotation (``c0:nvidia.com/gpu=2,...``) asks for."""
    found: dict[str, TemplateSpec] = {}
    if summary == ZERO_COUNTS:
        return ()
    for note in filter(None, summary.split(",")):
        _, _, rest = note.partition(":")
        name, _, count = rest.partition("=")
        legacy = parse_legacy(name)
        if legacy is None or not count.isdigit() or int(count) == 0:
            raise PodRejected(f"annotation {ANNOTATION_REWRITTEN}: {note!r} is not a rewrite")
        spec = TemplateSpec(legacy, int(count))
        found[spec.name] = spec
    return tuple(found.values())
