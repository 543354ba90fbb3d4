"""Events on pods whose container the runtime refused because of this driver's CDI devices
(and every pod of the node seen, to ``on_pod``: a PodGroup's late pods, ``pod_groups.join_pod``).

The container runtime resolves the CDI ids the plugin returned only when it creates a
container. When it rejects one (a device node it cannot stat, a spec it cannot parse) the
kubelet records ``CreateContainerError`` in the container's status with the runtime's text,
which names neither the claim nor the device, and retries forever.

:class:`RuntimeErrorWatcher` watches the pods bound to its node (``spec.nodeName``; needs
``list`` and ``watch`` on pods). For a container waiting with reason ``CreateContainerError``
or ``RunContainerError`` whose message mentions CDI, it posts one Warning Event
``CDIDeviceRejected`` on the pod for each claim of that container the plugin prepared,
naming the claim, its devices and CDI ids and quoting the runtime's message. The same
(pod, container, claim, message) is posted once; later kubelet retries do not repeat it.
:func:`rejections` is the pure part.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from driver.checkpoint.records import ClaimRecord
from driver.kube.http import KubeClient
from kubelet_plugin.event_recorder import EventRecorder, ObjectRef
from kubelet_plugin.list_watch import Json, ListWatch, describe
from kubelet_plugin.publisher import Backoff

log = logging.getLogger(__name__)

REASON = "CDIDeviceRejected"
RUNTIME_REASONS = frozenset({"CreateContainerError", "RunContainerError"})
PODS = "/api/v1/pods"
MAX_REMEMBERED = 1024


@dataclass(frozen=True)
class Rejection:
    pod: ObjectRef
    container: str
    claim_namespace: str
    claim_name: str
    claim_uid: str
    devices: tuple[str, ...]
    cdi_ids: tuple[str, ...]
    runtime_message: str

    def message(self) -> str:
        return (
            f"container {self.container}: the container runtime rejected the CDI devices of "
            f"claim {self.claim_namespace}/{self.claim_name} "
            f"(device {', '.join(self.devices)}; CDI {', '.join(self.cdi_ids)}): "
            f"{self.runtime_message}"
        )


def _mentions_cdi(message: str) -> bool:
    return "cdi" in message.lower()


def _claims_of_container(pod: Mapping[str, Any], container: Mapping[str, Any]) -> set[str]:
    """Names of the ResourceClaims a container uses: its ``resources.claims`` entries mapped
    through the pod's ``resourceClaims`` (named or generated), plus the pod's
    extended-resource claim when a request of it maps to the container."""
    spec, status = pod.get("spec") or {}, pod.get("status") or {}
    generated = {
        s.get("name"): s.get("resourceClaimName")
        for s in status.get("resourceClaimStatuses") or []
        if isinstance(s, Mapping)
    }
    by_entry: dict[str, str] = {}
    for rc in spec.get("resourceClaims") or []:
        name = rc.get("resourceClaimName") or generated.get(rc.get("name"))
        if name:
            by_entry[str(rc.get("name"))] = str(name)
    used = {
        str(c.get("name"))
        for c in (container.get("resources") or {}).get("claims") or []
        if isinstance(c, Mapping)
    }
    claims = {by_entry[e] for e in used if e in by_entry}
    extended = status.get("extendedResourceClaimStatus") or {}
    mappings = extended.get("requestMappings") or []
    if any(m.get("containerName") == container.get("name") for m in mappings):
        claims.add(str(extended.get("resourceClaimName")))
    return claims


def rejections(pod: Mapping[str, Any], records: Iterable[ClaimRecord]) -> list[Rejection]:
    """What to report for ``pod``: one entry per (waiting container refused over CDI, claim
    of that container prepared by this plugin)."""
    meta = pod.get("metadata") or {}
    namespace = str(meta.get("namespace") or "")
    ref = ObjectRef("v1", "Pod", str(meta.get("name") or ""), namespace, str(meta.get("uid") or ""))
    prepared = {(r.namespace, r.name): r for r in records if r.state == "PrepareCompleted"}
    containers = {
        str(c.get("name")): c
        for key in ("initContainers", "containers")
        for c in (pod.get("spec") or {}).get(key) or []
    }
    out = []
    for key in ("initContainerStatuses", "containerStatuses"):
        for cs in (pod.get("status") or {}).get(key) or []:
            waiting = (cs.get("state") or {}).get("waiting") or {}
            message = str(waiting.get("message") or "")
            if waiting.get("reason") not in RUNTIME_REASONS or not _mentions_cdi(message):
                continue
            container = containers.get(str(cs.get("name")))
            if container is None:
                continue
            for claim in sorted(_claims_of_container(pod, container)):
                record = prepared.get((namespace, claim))
                if record is None:
                    continue
                out.append(
                    Rejection(
                        pod=ref,
                        container=str(cs.get("name")),
                        claim_namespace=namespace,
                        claim_name=claim,
                        claim_uid=record.uid,
                        devices=tuple(d.device_name for d in record.devices),
                        cdi_ids=tuple(i for d in record.devices for i in d.cdi_device_ids),
                        runtime_message=message,
                    )
                )
    return out


class RuntimeErrorWatcher(ListWatch):
    """Watches this node's pods and reports CDI rejections as Events (see the module)."""

    def __init__(
        self,
        kube: KubeClient,
        node_name: str,
        records: Callable[[], Iterable[ClaimRecord]],
        events: EventRecorder,
        *,
        backoff: Backoff | None = None,
        request_timeout_s: float = 10.0,
        watch_seconds: int = 300,
        on_pod: Callable[[Mapping[str, Any]], object] | None = None,
    ) -> None:
        super().__init__(
            kube,
            PODS,
            {"fieldSelector": f"spec.nodeName={node_name}"},
            thread_name="runtime-errors",
            backoff=backoff,
            request_timeout_s=request_timeout_s,
            watch_seconds=watch_seconds,
            resync=True,  # every pod again each round: a pod group's join retried
        )
        self._on_pod = on_pod
        self._node = node_name
        self._records = records
        self._events = events
        self._reported: OrderedDict[tuple[str, str, str, str], None] = OrderedDict()

    def check(self, pod: Mapping[str, Any]) -> int:
        """Report the CDI rejections of one pod not reported before; how many were posted.
        Every pod seen also goes to ``on_pod`` (a failure there is logged, never fatal)."""
        if self._on_pod is not None:
            try:
                self._on_pod(pod)
            except Exception as e:
                meta = pod.get("metadata") or {}
                log.warning(
                    "pod hook failed pod=%s/%s error=%s",
                    meta.get("namespace"), meta.get("name"), e,
                )  # fmt: skip
        posted = 0
        found = rejections(pod, self._records()) if _any_waiting(pod) else []
        for r in found:
            key = (r.pod.uid, r.container, r.claim_uid, r.runtime_message)
            if key in self._reported:
                continue
            self._reported[key] = None
            while len(self._reported) > MAX_REMEMBERED:
                self._reported.popitem(last=False)
            log.warning(
                "container runtime rejected CDI devices pod=%s/%s container=%s claim=%s/%s "
                "devices=%s error=%s",
                r.pod.namespace, r.pod.name, r.container, r.claim_namespace, r.claim_name,
                ",".join(r.devices), r.runtime_message,
            )  # fmt: skip
            self._events.record(r.pod, "Warning", REASON, r.message())
            posted += 1
        return posted

    def _seen(self, obj: Json) -> None:
        self.check(obj)

    def _failed(self, e: Exception) -> None:
        log.warning("pod watch failed; relisting node=%s error=%s", self._node, describe(e))


def _any_waiting(pod: Mapping[str, Any]) -> bool:
    status = pod.get("status") or {}
    return any(
        ((cs.get("state") or {}).get("waiting") or {}).get("reason") in RUNTIME_REASONS
        for key in ("initContainerStatuses", "containerStatuses")
        for cs in status.get(key) or []
    )
