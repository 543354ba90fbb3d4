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
give them. Rewritten pods carry the label ``gpu.tranche.dev/legacy-rewritten=true``
and the annotation of the same name (``c0:nvidia.com/gpu=2``); the templates are
created after admission, for pods that exist (:mod:`controller.webhook.templates`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
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


def mutate_pod(pod: Mapping[str, Any]) -> Mutation | None:
    """The rewrite of ``pod``; None when it asks for no legacy resource. PodRejected, naming
    the field, when it cannot be admitted as written (a field of the wrong JSON type too)."""
    spec = _object(pod.get("spec"), "spec")
    old_claims = _array(spec.get("resourceClaims"), "spec.resourceClaims")
    existing = {
        _object(c, f"spec.resourceClaims[{i}]").get("name") for i, c in enumerate(old_claims)
    }
    patch: list[Json] = []
    claims: list[Json] = list(old_claims)
    templates: dict[str, TemplateSpec] = {}
    notes: list[str] = []
    for key, letter in (("initContainers", "i"), ("containers", "c")):
        for index, item in enumerate(_array(spec.get(key), f"spec.{key}")):
            field = f"spec.{key}[{index}].resources"
            container = _object(item, f"spec.{key}[{index}]")
            resources = _object(container.get("resources"), field)
            counts = _container_counts(resources, field)
            if not counts:
                continue
            new_resources: Json = {
                part: {k: v for k, v in (resources.get(part) or {}).items() if k not in counts}
                for part in ("limits", "requests")
            }
            new_resources = {k: v for k, v in new_resources.items() if v}
            container_claims = list(_array(resources.get("claims"), f"{field}.claims"))
            for name, count in counts.items():
                if count == 0:
                    continue
                legacy = parse_legacy(name)
                assert legacy is not None
                claim_name = f"legacy-{letter}{index}-{_label(legacy.short_name)}"
                if claim_name in existing:
                    raise PodRejected(
                        f"spec.resourceClaims: the pod already has a claim named {claim_name!r}, "
                        f"which the rewrite of {field} ({name}) needs"
                    )
                template = TemplateSpec(legacy, count)
                templates[template.name] = template
                claims.append({"name": claim_name, "resourceClaimTemplateName": template.name})
                container_claims.append({"name": claim_name})
                notes.append(f"{letter}{index}:{name}={count}")
            if container_claims:
                new_resources["claims"] = container_claims
            patch.append(
                {"op": "add", "path": f"/spec/{key}/{index}/resources", "value": new_resources}
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
