"""The plugin's :class:`driver.api.DraDriver`: claim reads, then the executor.

NodePrepareResources carries only claim references. The claims are read from
the API server first, concurrently and before the node-wide lock (slow reads
must not serialise behind device work): the first claim in the calling thread,
the others in a pool, together with each claim's Namespace
(``kubelet_plugin.namespace_reader``) whose labels give the claim's tenancy
(``driver.trust.policy``; answered in the calling thread while the namespace cache is
synced, since it then needs no read); each claim is then prepared by
:class:`driver.prepare.executor.DeviceState`, which checks trust levels. A claim
that cannot be read, or whose namespace cannot be read, fails alone with the reason
(gone, API server unreachable) in its ``error``: trust is never assumed. A trust
refusal becomes a ``TrustViolation`` Event on the claim and counts in
``tranche_trust_refusals_total``.
While a device plugin advertises the bridge's resources on the node (``refusal``, from
:class:`kubelet_plugin.bridge_check.DevicePluginWatch`) every claim fails with that
conflict, a ``DevicePluginConflict`` Event and a count, before anything is read.
A claim reserved for a PodGroup (``DRAWorkloadResourceClaims``) is resolved to the group's
pods on this node first (``kubelet_plugin.pod_groups``); a stale reservation fails the claim.
NodeUnprepareResources needs no read: the checkpoint has everything.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Protocol, TypeVar

from driver.api import ClaimRef, PrepareResult, UnprepareResult
from driver.errors import ApiUnavailable, ClaimError, TrancheError, TrustViolation, error_reason
from driver.kube.http import RESOURCE_V1, KubeClient
from driver.metrics import Metrics
from driver.prepare.claims import PodRef
from driver.prepare.executor import DeviceState
from driver.trust.policy import (
    DEFAULT_LEVEL,
    ColocationRefused,
    Tenancy,
    TrustLevel,
    resolve_tenants,
)
from kubelet_plugin.api_read import READ_TIMEOUT_S, read_raw
from kubelet_plugin.event_recorder import EventRecorder, ObjectRef
from kubelet_plugin.namespace_reader import NamespaceReader
from kubelet_plugin.pod_groups import PodGroupResolver

log = logging.getLogger(__name__)
_K = TypeVar("_K")
_V = TypeVar("_V")


class ClaimReader(Protocol):
    def read(self, ref: ClaimRef) -> Mapping[str, Any]:
        """The claim as JSON; ClaimError when it is gone, ApiUnavailable when unreadable."""
        ...


class ApiClaimReader:
    """Reads ResourceClaims (``resource.k8s.io/v1``) as raw JSON from the API server."""

    def __init__(self, kube: KubeClient, timeout_s: float = READ_TIMEOUT_S) -> None:
        self._kube = kube
        self._timeout_s = timeout_s

    def read(self, ref: ClaimRef) -> Mapping[str, Any]:
        return read_raw(
            self._kube,
            f"{RESOURCE_V1}/namespaces/{ref.namespace}/resourceclaims/{ref.name}",
            f"claim {ref.namespace}/{ref.name}",
            missing=" (deleted before it was prepared)",
            timeout_s=self._timeout_s,
        )


TRUST_EVENT_REASON = "TrustViolation"
DEVICE_PLUGIN_REASON = "DevicePluginConflict"


class PluginDriver:
    """Implements :class:`driver.api.DraDriver` over claim and namespace readers and a
    DeviceState. ``default_level`` applies to namespaces without a valid trust label."""

    def __init__(
        self,
        state: DeviceState,
        reader: ClaimReader,
        namespaces: NamespaceReader,
        *,
        default_level: TrustLevel = DEFAULT_LEVEL,
        events: EventRecorder | None = None,
        metrics: Metrics | None = None,
        read_workers: int = 8,
        refusal: Callable[[], str | None] | None = None,
        pod_groups: PodGroupResolver | None = None,
    ) -> None:
        self._state = state
        self._reader = reader
        self._namespaces = namespaces
        self._default_level = default_level
        self._events = events
        self._metrics = metrics
        self._refusal = refusal or (lambda: None)
        self._pod_groups = pod_groups
        self._pool = ThreadPoolExecutor(max_workers=read_workers, thread_name_prefix="claim-read")

    def close(self) -> None:
        self._pool.shutdown(wait=True)

    def prepare(self, claims: Sequence[ClaimRef]) -> dict[str, PrepareResult]:
        conflict = self._refusal()
        if conflict is not None:
            return {ref.uid: self._refuse(ref, conflict) for ref in claims}
        namespaces = list(dict.fromkeys(ref.namespace for ref in claims))
        # From memory (a synced namespace cache) in this thread; else read alongside the claims.
        inline = self._namespaces.synced
        tenancies: dict[str, Future[Tenancy]] = {
            ns: _now(self._tenancy, ns) if inline else self._pool.submit(self._tenancy, ns)
            for ns in namespaces
        }
        reads: dict[str, Future[Mapping[str, Any]]] = {
            ref.uid: self._pool.submit(self._reader.read, ref) for ref in claims[1:]
        }
        if claims:  # the first claim in this thread (most calls have one), the rest meanwhile
            reads[claims[0].uid] = _now(self._reader.read, claims[0])
        results: dict[str, PrepareResult] = {}
        for ref in claims:
            try:
                claim = reads[ref.uid].result()
                tenancy = _claim_tenancy(ref, tenancies[ref.namespace])

            except TrancheError as e:
                log.warning(
                    "claim or namespace read failed claim_uid=%s namespace=%s name=%s error=%s",
                    ref.uid,
                    ref.namespace,
                    ref.name,
                    e,
                )
                results[ref.uid] = PrepareResult(error=str(e), reason=error_reason(e))
                continue
            group_pods, group_error = self._group_pods(claim, ref)
            refusals: list[TrustViolation] = []
            results[ref.uid] = self._state.prepare(
                claim,
                ref,
                tenancy,
                refusals.append,
                group_pods=group_pods,
                group_error=group_error,
            )
            for refusal in refusals:
                self._audit(ref, refusal)
            if results[ref.uid].error:
                log.warning(
                    "prepare failed claim_uid=%s namespace=%s name=%s error=%s",
                    ref.uid,
                    ref.namespace,
                    ref.name,
                    results[ref.uid].error,
                )
        return results

    def _group_pods(
        self, claim: Mapping[str, Any], ref: ClaimRef
    ) -> tuple[dict[str, tuple[PodRef, ...]] | None, TrancheError | None]:
        """The pods of the PodGroups the claim is reserved for, or why they are unknown."""
        if self._pod_groups is None:
            return None, None
        try:
            return self._pod_groups.resolve(claim, ref), None
        except TrancheError as e:
            return None, e

    def _refuse(self, ref: ClaimRef, conflict: str) -> PrepareResult:
        """A claim not prepared while a device plugin serves the bridge's resources too."""
        log.warning(
            "prepare refused claim_uid=%s namespace=%s name=%s reason=%s",
            ref.uid,
            ref.namespace,
            ref.name,
            DEVICE_PLUGIN_REASON,
        )
        if self._metrics is not None:
            self._metrics.count_error("device-plugin-conflict")
        if self._events is not None:
            self._events.record(
                ObjectRef.resource_claim(ref.namespace, ref.name, ref.uid),
                "Warning",
                DEVICE_PLUGIN_REASON,
                f"not prepared on node {self._state.node_name}: {conflict}",
            )
        return PrepareResult(
            error=f"claim {ref.namespace}/{ref.name}: not prepared on node "
            f"{self._state.node_name} while a device plugin serves the same resources: {conflict}",
            reason="device-plugin-conflict",
        )

    def unprepare(self, claims: Sequence[ClaimRef]) -> dict[str, UnprepareResult]:
        return {ref.uid: self._state.unprepare(ref) for ref in claims}

    def _tenancy(self, namespace: str) -> Tenancy:
        """The namespace's tenancy now; label problems are logged, never fail open."""
        labels = self._namespaces.tenant_labels(namespace)
        resolution = resolve_tenants(labels, self._default_level)[namespace]
        for problem in resolution.problems:
            log.warning("trust label problem namespace=%s problem=%s", namespace, problem)
        return resolution.tenancy

    def _audit(self, ref: ClaimRef, refusal: TrustViolation) -> None:
        """The claim's Event and the refusal metric; neither can fail the prepare."""
        reason = refusal.reason.value if isinstance(refusal, ColocationRefused) else "Unknown"
        tenant = refusal.tenant if isinstance(refusal, ColocationRefused) else ref.namespace
        log.warning(
            "trust refusal layer=prepare claim_uid=%s namespace=%s tenant=%s reason=%s",
            ref.uid,
            ref.namespace,
            tenant,
            reason,
        )
        if self._metrics is not None:
            self._metrics.count_trust_refusal(tenant, reason)
        if self._events is not None:
            self._events.record(
                ObjectRef.resource_claim(ref.namespace, ref.name, ref.uid),
                "Warning",
                TRUST_EVENT_REASON,
                f"refused at prepare on node {self._state.node_name} ({reason}): {refusal}",
            )


def _now(read: Callable[[_K], _V], key: _K) -> Future[_V]:
    """``read(key)`` in the calling thread, as a finished future (no thread hop)."""
    done: Future[_V] = Future()
    try:
        done.set_result(read(key))
    except TrancheError as e:
        done.set_exception(e)
    return done


def _claim_tenancy(ref: ClaimRef, read: Future[Tenancy]) -> Tenancy:
    """The tenancy read for the claim's namespace; its failure names the claim too."""
    try:
        return read.result()
    except ClaimError as e:
        raise ClaimError(f"claim {ref.namespace}/{ref.name}: {e}") from e
    except TrancheError as e:
        raise ApiUnavailable(f"claim {ref.namespace}/{ref.name}: {e}; not prepared") from e
