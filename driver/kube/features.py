"""What the API server in front of us can do, found by discovery, never by a user flag.

Run once when the plugin starts (and again when it reconnects). Two halves:

* :func:`decide` is pure: from the server's ``/version``, the ``resource.k8s.io`` discovery
  documents and the outcome of the slice-layout probe it returns :class:`ServerFeatures`
  (unit-tested with documents recorded from real 1.34 - 1.37 servers).
* :func:`discover` does the requests with the plugin's thin client: ``GET /version``,
  ``GET /apis/resource.k8s.io`` and each served version's resource list, and two server-side
  dry runs (``dryRun=All``, nothing is stored) of small ResourceSlices: one that carries
  ``sharedCounters`` and ``consumesCounters`` together, one whose device has a taint and
  consumable capacity (fields the server drops when their gate is off).

The slice-layout probe: Kubernetes 1.34 accepts counters in the slice of the devices that
consume them ("combined"); 1.35 reshaped partitionable devices and refuses that ("only one of
``sharedCounters`` or ``devices`` is allowed"), counters live in slices of their own ("split");
with the ``DRAPartitionableDevices`` gate off (the default before 1.36) the server silently
drops both fields, so MIG placements cannot be offered at all ("none").
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from driver.errors import ApiUnavailable
from driver.kube.http import ApiError, KubeClient

log = logging.getLogger(__name__)

Json = dict[str, Any]
GROUP = "resource.k8s.io"
SliceLayout = Literal["split", "combined", "none"]
ProbeOutcome = Literal["combined-kept", "combined-refused", "fields-dropped"]
# Preference order when several versions serve a resource.
TAINT_RULE_VERSIONS = ("v1", "v1beta2", "v1beta1", "v1alpha3")

# Feature name -> what users lose when the server cannot provide it.
LOSSES: dict[str, str] = {
    "resource-v1": (
        "resource.k8s.io/v1 is not served: the plugin cannot publish devices or read claims "
        "(Kubernetes >= 1.34 is required)"
    ),
    "partitionable-devices": (
        "no dynamic MIG placements and no time-slice/MPS share devices (they need shared "
        "counters, gate DRAPartitionableDevices); whole GPUs and existing MIG instances "
        "are still offered"
    ),
    "device-taints": (
        "health taints are not published in the ResourceSlices (gate DRADeviceTaints): the "
        "scheduler keeps placing claims on an unhealthy GPU and its pods are not evicted; "
        "the health log lines, events and metrics still report it"
    ),
    "consumable-capacity": (
        "no time-slice/MPS share devices (they need allowMultipleAllocations and capacity "
        "request policies, gate DRAConsumableCapacity); whole GPUs and MIG are unaffected"
    ),
    "device-taint-rules": (
        "`tranche taint` cannot create DeviceTaintRules (no served API version: gate "
        "DRADeviceTaintRules/DRADeviceTaints and --runtime-config); health taints in the "
        "ResourceSlices still work"
    ),
}


@dataclass(frozen=True)
class ServerFeatures:
    """What the plugin (and ``tranche taint``) may use on this server."""

    server_version: str
    slice_layout: SliceLayout
    resource_v1: bool
    taint_rule_version: str | None  # "v1", "v1beta2", "v1alpha3" or None
    device_taints: bool = True
    consumable_capacity: bool = True
    unavailable: Mapping[str, str] = field(default_factory=dict)  # feature -> what users lose
    # scheduling.k8s.io version serving PodGroups ("v1beta1", "v1alpha3") or None: claims
    # reserved for a PodGroup (gate DRAWorkloadResourceClaims) need it
    pod_group_version: str | None = None
    # Taints one device may carry (DeviceTaintsMaxLength): 4 in 1.34, 16 from 1.35
    max_device_taints: int = 16
    # Device taints may have effect "None" (1.35+; 1.34 refuses the slice)
    taint_effect_none: bool = True
    # Counters the devices of one slice may consume together
    # (ResourceSliceMaxDeviceCountersPerSlice): 1024 in 1.34, no such limit from 1.35
    max_slice_device_counters: int | None = None

    def log_lines(self) -> list[str]:
        return [f"feature unavailable feature={k} loss={v!r}" for k, v in self.unavailable.items()]


def served_resources(group_versions: Mapping[str, Json]) -> dict[str, set[str]]:
    """``{"v1": APIResourceList, ...}`` → ``{"v1": {"resourceslices", ...}}`` (subresources
    left out)."""
    out: dict[str, set[str]] = {}
    for version, doc in group_versions.items():
        names = {str(r.get("name", "")) for r in doc.get("resources", ())}
        out[version] = {n for n in names if n and "/" not in n}
    return out


# DeviceTaintsMaxLength of resource.k8s.io/v1: 4 in k8s.io/api v0.34, 16 from v0.35 on.
DEVICE_TAINTS_MAX = 16
DEVICE_TAINTS_MAX_1_34 = 4


def _minor_version(version_doc: Json) -> tuple[int, int] | None:
    """``(1, 34)`` from ``/version``'s major and minor (the binary's version, whose
    validation applies), else from ``gitVersion``; None when neither can be read."""
    try:
        major = int(str(version_doc.get("major", "")).rstrip("+"))
        minor = int(str(version_doc.get("minor", "")).rstrip("+"))
    except ValueError:
        match = re.match(r"v?(\d+)\.(\d+)", str(version_doc.get("gitVersion", "")))
        if match is None:
            return None
        major, minor = int(match[1]), int(match[2])
    return major, minor


def max_device_taints(version_doc: Json) -> int:
    """Taints the server accepts per device; the smaller 1.34 limit when the version cannot
    be read, which every server accepts."""
    version = _minor_version(version_doc)
    return (
        DEVICE_TAINTS_MAX if version is not None and version >= (1, 35) else DEVICE_TAINTS_MAX_1_34
    )


# ResourceSliceMaxDeviceCountersPerSlice of resource.k8s.io/v1 in k8s.io/api v0.34; 1.35
# moved counters into slices of their own and dropped the per-slice sum.
DEVICE_COUNTERS_PER_SLICE_1_34 = 1024


def max_slice_device_counters(version_doc: Json) -> int | None:
    """Counters the devices of one slice may consume together: None (no limit) from 1.35;
    1.34's limit when the version cannot be read, which every server accepts."""
    version = _minor_version(version_doc)
    return None if version is not None and version >= (1, 35) else DEVICE_COUNTERS_PER_SLICE_1_34


def taint_effect_none(version_doc: Json) -> bool:
    """Whether the server accepts device taints with effect ``None`` (1.35 added it; 1.34
    knows ``NoSchedule`` and ``NoExecute`` only). False when the version cannot be read."""
    version = _minor_version(version_doc)
    return version is not None and version >= (1, 35)


def taint_rule_version(resources: Mapping[str, set[str]]) -> str | None:
    for version in TAINT_RULE_VERSIONS:
        if "devicetaintrules" in resources.get(version, set()):
            return version
    return None


def decide(
    version_doc: Json,
    group_versions: Mapping[str, Json],
    probe: ProbeOutcome | None,
    kept: frozenset[str] = frozenset({"taints", "allowMultipleAllocations"}),
) -> ServerFeatures:
    """The features of a server from its discovery documents, the layout probe (``None``
    when it could not run because ``resource.k8s.io/v1`` is missing) and the device fields
    the fields probe kept (:func:`kept_fields`)."""
    resources = served_resources(group_versions)
    has_v1 = "resourceslices" in resources.get("v1", set())
    unavailable: dict[str, str] = {}
    if not has_v1:
        unavailable["resource-v1"] = LOSSES["resource-v1"]
    layout: SliceLayout
    if probe == "combined-kept":
        layout = "combined"
    elif probe == "combined-refused":
        layout = "split"
    else:
        layout = "none"
        unavailable["partitionable-devices"] = LOSSES["partitionable-devices"]
    taints = "taints" in kept and has_v1
    if has_v1 and not taints:
        unavailable["device-taints"] = LOSSES["device-taints"]
    shares = "allowMultipleAllocations" in kept and has_v1
    if has_v1 and not shares:
        unavailable["consumable-capacity"] = LOSSES["consumable-capacity"]
    rules = taint_rule_version(resources)
    if rules is None:
        unavailable["device-taint-rules"] = LOSSES["device-taint-rules"]
    return ServerFeatures(
        server_version=str(version_doc.get("gitVersion", "unknown")),
        slice_layout=layout,
        resource_v1=has_v1,
        taint_rule_version=rules,
        device_taints=taints,
        consumable_capacity=shares,
        unavailable=unavailable,
        max_device_taints=max_device_taints(version_doc),
        taint_effect_none=taint_effect_none(version_doc),
        max_slice_device_counters=max_slice_device_counters(version_doc),
    )


def probe_slice(node_name: str, driver_name: str) -> Json:
    """The dry-run ResourceSlice: one counter set and one device consuming it, together."""
    return {
        "apiVersion": f"{GROUP}/v1",
        "kind": "ResourceSlice",
        "metadata": {"generateName": "tranche-layout-probe-"},
        "spec": {
            "driver": driver_name,
            "nodeName": node_name,
            "pool": {"name": node_name, "generation": 0, "resourceSliceCount": 1},
            "sharedCounters": [{"name": "probe", "counters": {"memory": {"value": "1"}}}],
            "devices": [
                {
                    "name": "probe",
                    "consumesCounters": [
                        {"counterSet": "probe", "counters": {"memory": {"value": "1"}}}
                    ],
                }
            ],
        },
    }


def fields_probe_slice(node_name: str, driver_name: str) -> Json:
    """The second dry run: one device with a taint and consumable capacity."""
    return {
        "apiVersion": f"{GROUP}/v1",
        "kind": "ResourceSlice",
        "metadata": {"generateName": "tranche-fields-probe-"},
        "spec": {
            "driver": driver_name,
            "nodeName": node_name,
            "pool": {"name": node_name, "generation": 0, "resourceSliceCount": 1},
            "devices": [
                {
                    "name": "probe",
                    "allowMultipleAllocations": True,
                    "capacity": {
                        "shares": {
                            "value": "2",
                            "requestPolicy": {"default": "1", "validRange": {"min": "1"}},
                        }
                    },
                    "taints": [{"key": "gpu.tranche.dev/probe", "effect": "NoSchedule"}],
                }
            ],
        },
    }


def kept_fields(status: int, answer: Json) -> frozenset[str]:
    """Device fields of :func:`fields_probe_slice` the server kept. A refusal (which no
    served version should give) counts as kept: the publisher's read-back check remains."""
    if status == 422:
        return frozenset({"taints", "allowMultipleAllocations"})
    devices: Sequence[Json] = answer.get("spec", {}).get("devices") or ({},)
    return frozenset(k for k in ("taints", "allowMultipleAllocations") if devices[0].get(k))


def probe_outcome(status: int, answer: Json) -> ProbeOutcome:
    """Classify the dry run's answer: kept, refused as invalid (422), or fields dropped."""
    if status == 422:
        return "combined-refused"
    spec = answer.get("spec", {})
    devices: Sequence[Json] = spec.get("devices") or ()
    kept = bool(spec.get("sharedCounters")) and any(d.get("consumesCounters") for d in devices)
    return "combined-kept" if kept else "fields-dropped"


POD_GROUP_VERSIONS = ("v1", "v1beta1", "v1alpha3")


def pod_group_version(kube: KubeClient) -> str | None:
    """The ``scheduling.k8s.io`` version that serves ``podgroups`` (v1beta1 before v1alpha3),
    None when none does (the Workload API is off by default in Kubernetes 1.37)."""
    group = served_document(kube, "/apis/scheduling.k8s.io")
    if group is None:
        return None
    served = {str(v.get("version")) for v in group.get("versions", ())}
    for version in POD_GROUP_VERSIONS:
        if version not in served:
            continue
        doc = served_document(kube, f"/apis/scheduling.k8s.io/{version}")
        if doc is not None and "podgroups" in served_resources({version: doc})[version]:
            return version
    return None


def served_document(kube: KubeClient, path: str) -> Json | None:
    """The discovery document at ``path``; None only when the server answers 404 (not
    served). Any other failed answer is an :class:`ApiError`: a busy server (503, 429)
    must not read as one without the API."""
    answer = kube.send("GET", path)
    if answer.status == 404:
        return None
    if not answer.ok:
        raise ApiError("GET", path, answer)
    return answer.json()


def discover(kube: KubeClient, node_name: str, driver_name: str) -> ServerFeatures:
    """Ask the server (discovery plus two dry runs). ``ApiUnavailable`` when it cannot
    answer now: unreachable, busy (5xx, 429) or an answer that is not JSON, so the caller
    waits and asks again; another error status is an :class:`ApiError`."""
    try:
        return _discover(kube, node_name, driver_name)
    except ApiError as e:
        if e.status == 429 or e.status >= 500:
            raise ApiUnavailable(f"discovery: {e}") from e
        raise
    except ValueError as e:
        raise ApiUnavailable(f"discovery: the API server sent invalid JSON: {e}") from e


def _discover(kube: KubeClient, node_name: str, driver_name: str) -> ServerFeatures:
    version_doc = kube.request("GET", "/version")
    group = served_document(kube, f"/apis/{GROUP}")
    versions = [str(v["version"]) for v in group.get("versions", ())] if group else []
    docs = {v: kube.request("GET", f"/apis/{GROUP}/{v}") for v in versions}
    probe: ProbeOutcome | None = None
    if "resourceslices" in served_resources(docs).get("v1", set()):
        path = f"/apis/{GROUP}/v1/resourceslices"
        answer = kube.send(
            "POST", path, body=probe_slice(node_name, driver_name), query={"dryRun": "All"}
        )
        if not answer.ok and answer.status != 422:
            raise ApiError("POST", path, answer)
        probe = probe_outcome(answer.status, answer.json() if answer.ok else {})
        answer = kube.send(
            "POST", path, body=fields_probe_slice(node_name, driver_name), query={"dryRun": "All"}
        )
        if not answer.ok and answer.status != 422:
            raise ApiError("POST", path, answer)
        if answer.status == 422:
            log.warning("fields probe refused answer=%s", answer.message())
        kept = kept_fields(answer.status, answer.json() if answer.ok else {})
        features = decide(version_doc, docs, probe, kept)
    else:
        features = decide(version_doc, docs, None)
    features = replace(features, pod_group_version=pod_group_version(kube))
    log.info(
        "api server features server=%s slice_layout=%s taint_rule_version=%s "
        "pod_group_version=%s unavailable=%s",
        features.server_version,
        features.slice_layout,
        features.taint_rule_version or "none",
        features.pod_group_version or "none",
        ",".join(features.unavailable) or "none",
    )
    return features
