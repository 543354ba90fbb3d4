"""A kubelet stand-in for tests and the demo: it plays the kubelet's DRA part, nothing else.

* Plugin watcher: polls ``<kubelet root>/plugins_registry`` (sub-directories too,
  names starting with ``.`` skipped), registers every new socket, forgets plugins
  whose registration socket disappears.
* DRA manager (with an ``api_client``): at start deletes the node's
  ResourceSlices (field selector ``spec.nodeName``) as a starting kubelet does;
  then polls the pods bound to the node and calls ``NodePrepareResources`` once
  all claims of a pod are allocated and reserved for it, one call per driver;
  calls ``NodeUnprepareResources`` when the last pod using a claim is gone or
  terminating, then finishes deleting the terminating pod (grace period 0).
* Health: opens the negotiated ``NodeWatchResources`` stream of every plugin and
  records each device list it receives.

Every call and answer is appended to :attr:`KubeletSimulator.calls`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from driver.kube.client import RESOURCE_V1
from hack.kubeletsim.client import (
    STYLES,
    ClaimRequest,
    HealthEntry,
    PluginConnection,
    PrepareAnswer,
    Registration,
    RegistrationRejectedError,
    register,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CallRecord:
    method: str  # GetInfo+Notify | NodePrepareResources | NodeUnprepareResources | DeleteSlices
    driver: str
    request: tuple[str, ...]  # "namespace/name (uid)" per claim, or the object acted on
    answer: str  # a readable summary of the answer
    error: str = ""


@dataclass(frozen=True)
class HealthUpdate:
    driver: str
    service: str
    devices: tuple[HealthEntry, ...]


@dataclass
class _Plugin:
    registration: Registration
    connection: PluginConnection
    health_call: Any = None  # the open stream, cancelled at deregistration
    health_thread: threading.Thread | None = None
    closed: threading.Event = field(default_factory=threading.Event)


@dataclass
class _PreparedClaim:
    ref: ClaimRequest
    drivers: tuple[str, ...]
    pods: set[str]  # live pods using the claim
    leaving: set[str] = field(default_factory=set)  # gone pods waiting for the unprepare


class KubeletSimulator:
    def __init__(
        self,
        node_name: str,
        kubelet_root: str | Path,
        api_client: Any = None,
        *,
        version_style: str = "1.37",
        poll_interval: float = 0.2,
        health_retry: float = 1.0,
        update_pod_status: bool = True,
        workload_claims: bool = False,
    ) -> None:
        if version_style not in STYLES:
            raise ValueError(f"version_style {version_style!r}: expected one of {sorted(STYLES)}")
        self.node_name = node_name
        self.registry_dir = Path(kubelet_root) / "plugins_registry"
        self.style = STYLES[version_style]
        self._api = api_client
        self._poll = poll_interval
        self._health_retry = health_retry
        self._update_pod_status = update_pod_status
        # kubelet v1.37.2 with DRAWorkloadResourceClaims: a claim reserved for the pod's
        # PodGroup is the pod's too (resourceclaim.IsReservedForPod, acceptPodGroupReservation)
        self._workload_claims = workload_claims
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._plugins: dict[str, _Plugin] = {}  # registration socket → plugin
        self._rejected: set[str] = set()
        self._claims: dict[str, _PreparedClaim] = {}  # claim uid → prepared claim
        self._running_pods: set[str] = set()
        self.calls: list[CallRecord] = []
        self.prepared: dict[str, PrepareAnswer] = {}  # claim uid → last successful answer
        self.health_updates: list[HealthUpdate] = []

    # lifecycle

    def start(self) -> None:
        self.registry_dir.mkdir(parents=True, exist_ok=True)
        if self._api is not None:
            self._delete_node_slices()
        loops: list[Callable[[], None]] = [self._watch_registry]
        if self._api is not None:
            loops.append(self._watch_pods)
        for loop in loops:
            thread = threading.Thread(target=self._forever(loop), name=loop.__name__, daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=10)
        self._threads.clear()
        with self._lock:
            for sock in list(self._plugins):
                self._forget(sock)

    def _forever(self, step: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            while not self._stop.is_set():
                try:
                    step()
                except Exception:
                    log.exception("kubeletsim step failed step=%s", step.__name__)
                self._stop.wait(self._poll)

        return run

    # queries for tests and the demo

    def registrations(self) -> list[Registration]:
        with self._lock:
            return [p.registration for p in self._plugins.values()]

    def wait_for(self, condition: Callable[[], bool], timeout: float = 30.0) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                if condition():
                    return True
            time.sleep(0.05)
        with self._lock:
            return condition()

    def _record(self, record: CallRecord) -> None:
        with self._lock:
            self.calls.append(record)
        log.info(
            "kubeletsim call method=%s driver=%s request=%s answer=%s error=%s",
            record.method,
            record.driver,
            ",".join(record.request),
            record.answer,
            record.error,
        )

    # plugin watcher

    def _watch_registry(self) -> None:
        present = {
            str(p)
            for p in self.registry_dir.rglob("*")
            if p.is_socket() and not any(part.startswith(".") for part in p.parts)
        }
        with self._lock:
            for sock in set(self._plugins) - present:
                self._forget(sock)
            self._rejected &= present
            new = sorted(present - set(self._plugins) - self._rejected)
        for sock in new:
            self._register(sock)

    def _register(self, sock: str) -> None:
        try:
            registration = register(self.style, sock)
        except RegistrationRejectedError as rejected:
            self._rejected.add(sock)
            self._record(CallRecord("GetInfo+Notify", "", (sock,), "rejected", str(rejected)))
            return
        except grpc.RpcError as err:
            self._record(CallRecord("GetInfo+Notify", "", (sock,), "unreachable", str(err)))
            return
        plugin = _Plugin(registration, PluginConnection(registration))
        answer = f"{registration.dra_service} health={registration.health_service or 'none'}"
        self._record(CallRecord("GetInfo+Notify", registration.driver, (sock,), answer))
        with self._lock:
            self._plugins[sock] = plugin
        if registration.health_service:
            plugin.health_thread = threading.Thread(
                target=self._health_loop, args=(plugin,), name="health", daemon=True
            )
            plugin.health_thread.start()

    def _forget(self, sock: str) -> None:
        plugin = self._plugins.pop(sock)
        plugin.closed.set()
        if plugin.health_call is not None:
            plugin.health_call.cancel()
        plugin.connection.close()
        log.info("kubeletsim deregistered driver=%s socket=%s", plugin.registration.driver, sock)

    def _health_loop(self, plugin: _Plugin) -> None:
        reg = plugin.registration
        while not plugin.closed.is_set() and not self._stop.is_set():
            try:
                call, updates = plugin.connection.watch_health()
                plugin.health_call = call
                for devices in updates:
                    with self._lock:
                        self.health_updates.append(
                            HealthUpdate(reg.driver, reg.health_service, devices)
                        )
            except grpc.RpcError as err:
                if not plugin.closed.is_set():
                    log.info("kubeletsim health stream ended driver=%s error=%s", reg.driver, err)
            except ValueError:
                return  # the channel was closed while deregistering
            plugin.closed.wait(self._health_retry)

    def plugin_for(self, driver: str) -> PluginConnection | None:
        """The most recently registered instance of ``driver``, as the kubelet prefers it."""
        with self._lock:
            found = [p for p in self._plugins.values() if p.registration.driver == driver]
            return found[-1].connection if found else None

    # direct calls (also used by the pod loop)

    def prepare(self, driver: str, claims: Sequence[ClaimRequest]) -> dict[str, PrepareAnswer]:
        names = tuple(f"{c.namespace}/{c.name} ({c.uid})" for c in claims)
        connection = self.plugin_for(driver)
        if connection is None:
            self._record(CallRecord("NodePrepareResources", driver, names, "", "not registered"))
            return {}
        try:
            answers = connection.prepare(claims)
        except grpc.RpcError as err:
            self._record(CallRecord("NodePrepareResources", driver, names, "", _rpc_error(err)))
            raise
        summary = "; ".join(
            f"{uid}: " + (a.error or ",".join(f"{d.pool_name}/{d.device_name}" for d in a.devices))
            for uid, a in sorted(answers.items())
        )
        errors = "; ".join(a.error for a in answers.values() if a.error)
        self._record(CallRecord("NodePrepareResources", driver, names, summary, errors))
        with self._lock:
            self.prepared.update({uid: a for uid, a in answers.items() if not a.error})
        return answers

    def unprepare(self, driver: str, claims: Sequence[ClaimRequest]) -> dict[str, str]:
        names = tuple(f"{c.namespace}/{c.name} ({c.uid})" for c in claims)
        connection = self.plugin_for(driver)
        if connection is None:
            self._record(CallRecord("NodeUnprepareResources", driver, names, "", "not registered"))
            return {}
        try:
            answers = connection.unprepare(claims)
        except grpc.RpcError as err:
            self._record(CallRecord("NodeUnprepareResources", driver, names, "", _rpc_error(err)))
            raise
        summary = "; ".join(f"{uid}: {e or 'ok'}" for uid, e in sorted(answers.items()))
        errors = "; ".join(e for e in answers.values() if e)
        self._record(CallRecord("NodeUnprepareResources", driver, names, summary, errors))
        with self._lock:
            for uid, error in answers.items():
                if not error:
                    self.prepared.pop(uid, None)
        return answers

    # DRA manager over the API server

    def _request(
        self, method: str, path: str, body: Any = None, content_type: str = "application/json"
    ) -> Any:
        """One API request with a JSON body and answer (the raw JSON keeps fields the
        client models may not know yet). 404 → None; other failures raise ApiException."""
        from kubernetes import client  # noqa: PLC0415 (only with an API server)

        from driver.kube.client import send  # noqa: PLC0415

        answer = send(self._api, method, path, body=body, content_type=content_type)
        if answer.status == 404:
            return None
        if not answer.ok:
            raise client.ApiException(
                status=answer.status, reason=answer.reason, body=answer.body.decode()
            )
        return answer.json()

    def _delete_node_slices(self) -> None:
        selector = f"spec.nodeName={self.node_name}"
        self._request("DELETE", f"{RESOURCE_V1}/resourceslices?fieldSelector={selector}")
        self._record(CallRecord("DeleteSlices", "", (selector,), "deleted"))

    def _watch_pods(self) -> None:
        pods = self._request("GET", f"/api/v1/pods?fieldSelector=spec.nodeName={self.node_name}")
        live: set[str] = set()
        for pod in pods["items"]:
            meta = pod["metadata"]
            if meta.get("deletionTimestamp") or pod.get("status", {}).get("phase") in (
                "Succeeded",
                "Failed",
            ):
                continue
            live.add(meta["uid"])
            self._sync_pod(pod)
        with self._lock:
            for claim in self._claims.values():
                gone = claim.pods - live
                claim.pods -= gone
                claim.leaving = set() if claim.pods else claim.leaving | gone
            done = [uid for uid, c in self._claims.items() if not c.pods]
        for uid in done:
            self._unprepare_claim(uid)
        for pod in pods["items"]:
            meta = pod["metadata"]
            if meta.get("deletionTimestamp") and not self._pod_holds_claims(meta["uid"]):
                self._finish_deletion(meta)

    def _pod_holds_claims(self, pod_uid: str) -> bool:
        with self._lock:
            return any(pod_uid in c.pods | c.leaving for c in self._claims.values())

    def _claim_names(self, pod: dict[str, Any]) -> list[str] | None:
        """The pod's ResourceClaim names, or None while a generated name is still missing."""
        statuses = {
            s["name"]: s.get("resourceClaimName")
            for s in pod.get("status", {}).get("resourceClaimStatuses", [])
        }
        names: list[str] = []
        for entry in pod["spec"].get("resourceClaims", []):
            if entry.get("resourceClaimName"):
                names.append(entry["resourceClaimName"])
            elif entry["name"] not in statuses:
                return None
            elif statuses[entry["name"]]:
                names.append(statuses[entry["name"]])
        extended = pod.get("status", {}).get("extendedResourceClaimStatus", {})
        if extended.get("resourceClaimName"):
            names.append(extended["resourceClaimName"])
        return names

    def _reserved_for(self, pod: dict[str, Any], status: dict[str, Any]) -> bool:
        """The claim is reserved for the pod, or (workload claims on) for the pod's PodGroup
        by group, resource and name: a pod does not know its PodGroup's UID."""
        group = ((pod["spec"].get("schedulingGroup") or {}).get("podGroupName")) or None
        for r in status.get("reservedFor", []):
            if r.get("uid") == pod["metadata"]["uid"]:
                return True
            if (
                self._workload_claims
                and group is not None
                and r.get("apiGroup") == "scheduling.k8s.io"
                and r.get("resource") == "podgroups"
                and r.get("name") == group
            ):
                return True
        return False

    def _sync_pod(self, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        names = self._claim_names(pod)
        if names is None:
            return
        by_driver: dict[str, list[ClaimRequest]] = {}
        refs: dict[str, tuple[ClaimRequest, tuple[str, ...]]] = {}
        for name in names:
            claim = self._request(
                "GET", f"{RESOURCE_V1}/namespaces/{meta['namespace']}/resourceclaims/{name}"
            )
            if claim is None:
                return
            status = claim.get("status", {})
            if "allocation" not in status or not self._reserved_for(pod, status):
                return
            ref = ClaimRequest(meta["namespace"], claim["metadata"]["uid"], name)
            drivers = tuple(
                sorted({r["driver"] for r in status["allocation"]["devices"].get("results", [])})
            )
            refs[ref.uid] = (ref, drivers)
            with self._lock:
                known = self._claims.get(ref.uid)
                if known is not None:
                    known.pods.add(meta["uid"])
                    continue
            for driver in drivers:
                by_driver.setdefault(driver, []).append(ref)
        ok = True
        for driver, claims in sorted(by_driver.items()):
            try:
                answers = self.prepare(driver, claims)
            except grpc.RpcError:
                return
            ok = ok and all(c.uid in answers and not answers[c.uid].error for c in claims)
        if not ok:
            return
        with self._lock:
            for uid, (ref, drivers) in refs.items():
                self._claims.setdefault(uid, _PreparedClaim(ref, drivers, set())).pods.add(
                    meta["uid"]
                )
        self._mark_running(pod)

    def _unprepare_claim(self, uid: str) -> None:
        with self._lock:
            claim = self._claims[uid]
        for driver in claim.drivers:
            try:
                errors = self.unprepare(driver, [claim.ref])
            except grpc.RpcError:
                return
            if errors.get(uid, "missing") != "":
                return
        with self._lock:
            self._claims.pop(uid, None)

    def _mark_running(self, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        if not self._update_pod_status or meta["uid"] in self._running_pods:
            return
        if pod.get("status", {}).get("phase") != "Running":
            now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            body = {
                "status": {
                    "phase": "Running",
                    "startTime": now,
                    "conditions": [
                        {"type": "Ready", "status": "True", "lastTransitionTime": now},
                    ],
                }
            }
            path = f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}/status"
            self._request("PATCH", path, body, "application/merge-patch+json")
        self._running_pods.add(meta["uid"])

    def _finish_deletion(self, meta: dict[str, Any]) -> None:
        """Complete a graceful deletion, as the kubelet does once the containers are gone."""
        body = {"gracePeriodSeconds": 0, "preconditions": {"uid": meta["uid"]}}
        path = f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}"
        try:
            self._request("DELETE", path, body)
        except Exception as err:
            if getattr(err, "status", None) != 409:  # 409: a new pod of the same name
                raise
        self._running_pods.discard(meta["uid"])


def _rpc_error(err: grpc.RpcError) -> str:
    if isinstance(err, grpc.Call):
        return f"{err.code().name}: {err.details()}"
    return str(err)
