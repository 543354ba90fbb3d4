"""Leader election through a ``coordination.k8s.io/v1`` Lease.

Like client-go's elector, expiry is judged by this process's own monotonic
clock: a lease is free when its record (holder, renew time) has not changed
for ``lease_duration_s`` since this process first saw it, so clock skew
between replicas does not matter. Updates carry the resourceVersion, so of
two replicas racing for a free lease exactly one wins.

A leader acts only while its last successful renew is younger than
``renew_deadline_s``, also while a renew request is still waiting: each lease
request's timeout is bounded by the time left before that deadline, and
``is_leader`` turns false when it passes, well before another replica may take
the lease (``lease_duration_s`` after it last saw the record change).
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kubernetes import client

from controller.kube_client import ApiCallError, Json, request
from driver.errors import TrancheError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LeaseConfig:
    namespace: str
    name: str
    identity: str
    lease_duration_s: float = 15.0
    renew_deadline_s: float = 10.0
    retry_period_s: float = 2.0


_MIN_TIMEOUT_S = 0.1


def _micro_time() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaderElector:
    """Acquires and renews the lease in a thread; ``is_leader`` says where it stands."""

    def __init__(
        self,
        api: client.ApiClient,
        config: LeaseConfig,
        on_change: Callable[[bool], None] = lambda _leader: None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._api = api
        self._cfg = config
        self._on_change = on_change
        self._clock = clock
        self._leader = False
        self._observed: tuple[Any, ...] | None = None
        self._observed_at = 0.0
        self._last_renew = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def is_leader(self) -> bool:
        """Leading, and the last successful renew is younger than the renew deadline."""
        return self._leader and self._renew_left() > 0

    def _renew_left(self) -> float:
        return self._cfg.renew_deadline_s - (self._clock() - self._last_renew)

    def _timeout(self) -> float:
        """A lease request's timeout: as leader, the time left before the renew deadline."""
        if not self._leader:
            return self._cfg.renew_deadline_s
        return max(self._renew_left(), _MIN_TIMEOUT_S)

    def _path(self, name: str = "") -> str:
        base = f"/apis/coordination.k8s.io/v1/namespaces/{self._cfg.namespace}/leases"
        return f"{base}/{name}" if name else base

    def try_acquire_or_renew(self) -> bool:
        """One round: True when this process holds the lease afterwards."""
        cfg = self._cfg
        what = f"lease {cfg.namespace}/{cfg.name}"
        now = self._clock()
        spec = {
            "holderIdentity": cfg.identity,
            "leaseDurationSeconds": max(1, round(cfg.lease_duration_s)),
            "renewTime": _micro_time(),
        }
        current = request(
            self._api, f"read {what}", "GET", self._path(cfg.name), timeout_s=self._timeout()
        )
        if current is None:
            body = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": cfg.name, "namespace": cfg.namespace},
                "spec": {**spec, "acquireTime": spec["renewTime"], "leaseTransitions": 0},
            }
            return self._write(what, "POST", self._path(), body, now)
        old: Json = current.get("spec") or {}
        record = (old.get("holderIdentity"), old.get("renewTime"), old.get("leaseTransitions"))
        if record != self._observed:
            self._observed, self._observed_at = record, now
        holder = old.get("holderIdentity") or ""
        duration = float(old.get("leaseDurationSeconds") or cfg.lease_duration_s)
        if holder and holder != cfg.identity and now < self._observed_at + duration:
            return False
        new_spec = {**old, **spec}
        if holder != cfg.identity:
            new_spec["acquireTime"] = spec["renewTime"]
            new_spec["leaseTransitions"] = int(old.get("leaseTransitions") or 0) + 1
        body = {**current, "spec": new_spec}
        return self._write(what, "PUT", self._path(cfg.name), body, now)

    def _write(self, what: str, method: str, path: str, body: Json, now: float) -> bool:
        try:
            request(self._api, f"write {what}", method, path, body=body, timeout_s=self._timeout())
        except ApiCallError as e:
            if e.status == 409:  # another replica wrote first
                return False
            raise
        self._last_renew = now
        return True

    def release(self) -> None:
        """Give the lease up (on shutdown) so another replica takes over at once."""
        if not self._leader:
            return
        cfg = self._cfg
        what = f"lease {cfg.namespace}/{cfg.name}"
        try:
            current = request(self._api, f"read {what}", "GET", self._path(cfg.name))
            spec = (current or {}).get("spec") or {}
            if current and spec.get("holderIdentity") == cfg.identity:
                spec = {**spec, "holderIdentity": "", "leaseDurationSeconds": 1}
                body = {**current, "spec": spec}
                request(self._api, f"release {what}", "PUT", self._path(cfg.name), body=body)
        except TrancheError as e:
            log.warning("lease release failed lease=%s error=%s", what, e)
        self._set(False)

    def _set(self, leader: bool) -> None:
        if leader != self._leader:
            self._leader = leader
            log.info(
                "leadership changed lease=%s/%s identity=%s leader=%s",
                self._cfg.namespace, self._cfg.name, self._cfg.identity, leader,
            )  # fmt: skip
            self._on_change(leader)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                held = self.try_acquire_or_renew()
            except Exception as e:
                if isinstance(e, TrancheError):
                    log.warning("lease round failed lease=%s error=%s", self._cfg.name, e)
                else:
                    log.exception("lease round failed unexpectedly lease=%s", self._cfg.name)
                # A leader that cannot renew within the deadline must stop acting as one.
                held = self.is_leader
            self._set(held)
            self._stop.wait(self._cfg.retry_period_s)

    def running(self) -> bool:
        """The election thread is started and alive."""
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="leader-election", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self.release()
