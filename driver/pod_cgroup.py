"""Find the pod and container of a process from its ``/proc/<pid>/cgroup`` text.

The kubelet names a pod's cgroup after the pod UID, in one of two layouts:

* cgroupfs driver (cgroup v1 or v2): ``/kubepods/burstable/pod<uid>/<container id>``
  (Guaranteed pods sit directly under ``/kubepods/pod<uid>``);
* systemd driver: ``/kubepods.slice/kubepods-besteffort.slice/
  kubepods-besteffort-pod<uid with _ for ->.slice/cri-containerd-<id>.scope``.

Only the first pod segment below the first ``kubepods`` segment counts: a
container that may create cgroups of its own (delegation) can nest a directory
named like another pod below its own, and that must not move its usage onto
someone else's bill.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_UUID = r"[0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12}"
_HASH = r"[0-9a-f]{32}"  # static (mirror) pods: an MD5 of the manifest, no dashes
_POD_SEGMENT = re.compile(
    rf"^(?:(?:kubelet-)?kubepods(?:-[a-z]+)?-)?pod(?P<uid>{_UUID}|{_HASH})(?:\.slice)?$"
)
_SCOPE = re.compile(r"^(?:(?P<runtime>[a-z][a-z0-9-]*?)-)?(?P<id>[0-9a-f]{12,128})(?:\.scope)?$")


@dataclass(frozen=True)
class PodContainer:
    """Where a process runs: the pod UID (with dashes) and the container id ("" if unknown)."""

    pod_uid: str
    container_id: str


def _is_kubepods(segment: str) -> bool:
    return segment in ("kubepods", "kubepods.slice") or segment.startswith("kubelet-kubepods")


def _from_path(path: str) -> PodContainer | None:
    segments = [s for s in path.split("/") if s]
    start = next((i for i, s in enumerate(segments) if _is_kubepods(s)), None)
    if start is None:
        return None
    for i in range(start + 1, len(segments)):
        pod = _POD_SEGMENT.match(segments[i])
        if pod is None:
            continue
        uid = pod.group("uid").replace("_", "-")
        container = ""
        if i + 1 < len(segments):
            scope = _SCOPE.match(segments[i + 1])
            if scope is not None and scope.group("runtime") != "crio-conmon":
                container = scope.group("id")
        return PodContainer(pod_uid=uid, container_id=container)
    return None


def parse_cgroup(text: str) -> PodContainer | None:
    """The pod and container named by ``/proc/<pid>/cgroup`` content, or None if not a pod's.

    Lines are ``hierarchy-id:controllers:path``. The unified (v2) line ``0::`` is
    preferred; on a v1 host every controller line names the same pod.
    """
    paths: list[str] = []
    for line in text.splitlines():
        parts = line.strip().split(":", 2)
        if len(parts) != 3:
            continue
        if parts[0] == "0" and parts[1] == "":
            paths.insert(0, parts[2])
        else:
            paths.append(parts[2])
    for path in paths:
        found = _from_path(path)
        if found is not None:
            return found
    return None


def pod_cgroup_paths(pod_uid: str) -> tuple[str, ...]:
    """Where the kubelet puts a pod's cgroup (relative to the cgroup v2 root), for every
    QoS class and both cgroup drivers; the one that exists on the node is the pod's."""
    flat = pod_uid.replace("-", "_")
    return (
        f"/kubepods/pod{pod_uid}",
        f"/kubepods/burstable/pod{pod_uid}",
        f"/kubepods/besteffort/pod{pod_uid}",
        f"/kubepods.slice/kubepods-pod{flat}.slice",
        f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{flat}.slice",
        f"/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{flat}.slice",
    )
