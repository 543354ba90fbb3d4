"""Publishes the node's ResourceSlices and keeps them published.

One pool per node. :class:`Publisher` runs two threads: a sync loop that makes
the API server hold exactly the desired slices (create, replace, delete; the
pool generation bumped only when the desired content changed), and a watch on
the slices of this node and driver that wakes the sync loop whenever one is
added, edited or deleted (a starting kubelet deletes every slice of its node).
Failures are retried with exponential back-off; a write whose read-back lacks
a field (a feature gate off in the API server) is a clear error, and the pool
is withdrawn rather than published without, say, its MIG counters or taints.

Slices are owned by the Node object, so they go when the node goes.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from driver.errors import ApiUnavailable, ConfigError, PermanentError
from driver.kube.http import RESOURCE_V1, ApiError, KubeClient, Watch
from kubelet_plugin import slice_diff

log = logging.getLogger(__name__)

SLICES = f"{RESOURCE_V1}/resourceslices"
WRITERS = 4  # slice writes in flight at once (the first publish of a node: 9 creates)

Json = dict[str, Any]
CountHook = Callable[[str], None]


class FieldDroppedError(PermanentError):
    """The API server did not keep a field that was written (a feature gate is off)."""


class Backoff:
    """Exponential back-off: ``initial`` doubling up to ``cap`` seconds; reset on success."""

    def __init__(self, initial: float = 0.5, cap: float = 30.0) -> None:
        self.initial, self.cap = initial, cap
        self._next = initial

    def next(self) -> float:
        delay = self._next
        self._next = min(self._next * 2, self.cap)
        return delay

    def reset(self) -> None:
        self._next = self.initial


class Publisher:
    """Keeps the ResourceSlices of one node's pool equal to the desired set.

    ``update()`` hands over a new desired set (from :func:`driver.devices.slices.build_slices`);
    ``wait_published()`` blocks until the API server holds it. ``on_count`` is
    called with an event name (``slice_created``, ``slice_updated``,
    ``slice_deleted``, ``generation_bump``, ``sync``, ``sync_error``,
    ``field_dropped``) for metrics.
    """

    def __init__(
        self,
        kube: KubeClient,
        driver_name: str,
        node_name: str,
        *,
        on_count: CountHook | None = None,
        resync_seconds: float = 300.0,
        permanent_retry_seconds: float = 60.0,
        backoff: Backoff | None = None,
        request_timeout: float = 10.0,
        watch_seconds: int = 300,
        on_reconnect: Callable[[], None] | None = None,
    ) -> None:
        self.driver_name = driver_name
        self.node_name = node_name
        self._kube = kube
        self._count = on_count or (lambda _name: None)
        self._resync = resync_seconds
        self._permanent_retry = permanent_retry_seconds
        self._backoff = backoff or Backoff()
        self._watch_backoff = Backoff(self._backoff.initial, self._backoff.cap)
        self._timeout = request_timeout
        self._watch_seconds = watch_seconds
        self._selector = f"spec.nodeName={node_name},spec.driver={driver_name}"
        # Called after the first successful sync that follows an unreachable API server
        # (the server may have been upgraded or downgraded meanwhile: discovery again).
        self._on_reconnect = on_reconnect
        self._unreachable = False

        self._cond = threading.Condition()
        self._desired: list[Json] | None = None
        self._version = 0  # bumped by update()
        self._published_version = -1  # the version the API server was last seen to hold
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._watch: Watch | None = None

        self.generation = 0
        self._published_digest: str | None = None
        self._desired_digest: tuple[int, str] | None = None  # (version, digest), sync thread's
        self.error: str | None = None  # the last failure, None after a successful sync
        self.published = False  # a sync has made the API server hold a desired set

    # --- public interface -------------------------------------------------------------

    def update(self, desired: Sequence[Mapping[str, Any]]) -> None:
        """Publish ``desired`` (full ResourceSlice dicts) from now on."""
        slices = [json.loads(json.dumps(s)) for s in desired]
        for s in slices:
            spec = s.get("spec", {})
            if (spec.get("driver"), spec.get("nodeName"), spec.get("pool", {}).get("name")) != (
                self.driver_name,
                self.node_name,
                self.node_name,
            ):
                raise ConfigError(
                    f"ResourceSlice {s.get('metadata', {}).get('name')!r}: spec.driver, "
                    f"spec.nodeName and spec.pool.name must be {self.driver_name!r}, "
                    f"{self.node_name!r} and {self.node_name!r}"
                )
        with self._cond:
            self._desired = slices
            self._version += 1
        self._wake.set()

    def start(self) -> None:
        if self._threads:
            return
        for target, name in ((self._sync_loop, "sync"), (self._watch_loop, "watch")):
            t = threading.Thread(target=target, name=f"slice-publisher-{name}", daemon=True)
            t.start()
            self._threads.append(t)

    def stop(self, timeout: float = 10.0) -> None:
        """Stop both threads; the published slices stay."""
        self._stop.set()
        self._wake.set()
        self._close_watch()
        for t in self._threads:
            t.join(timeout)
        self._threads.clear()

    def wait_published(self, timeout: float) -> bool:
        """Block until the API server holds the last desired set; False on timeout."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._published_version != self._version or self._desired is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
            return True

    def resync(self) -> None:
        """Compare with the API server now (normally done on watch events and periodically)."""
        self._wake.set()

    # --- sync loop --------------------------------------------------------------------

    def _sync_loop(self) -> None:
        not_before = 0.0
        failed_version = -1
        while not self._stop.is_set():
            self._wake.wait(self._resync)
            if self._stop.is_set():
                return
            with self._cond:
                version = self._version
            delay = not_before - time.monotonic()
            if delay > 0 and version == failed_version:
                self._stop.wait(delay)  # back-off: events alone do not cut it short
                continue
            self._wake.clear()
            try:
                self._sync()
            except PermanentError as e:
                self._fail(str(e), permanent=True)
                not_before, failed_version = time.monotonic() + self._permanent_retry, version
                self._wake.set()
            except Exception as e:
                self._unreachable = self._unreachable or isinstance(e, ApiUnavailable)
                self._fail(_describe(e), permanent=False)
                not_before, failed_version = time.monotonic() + self._backoff.next(), version
                self._wake.set()
            else:
                if self._reconnected():
                    self.error = None
                    self._backoff.reset()
                    not_before, failed_version = 0.0, -1
                else:
                    not_before, failed_version = time.monotonic() + self._backoff.next(), version
                    self._wake.set()

    def _reconnected(self) -> bool:
        """After a sync that followed an unreachable API server, run ``on_reconnect``. False
        when it failed: the error is kept (``/readyz`` names it) and the next sync runs it
        again. Any exception: a bad answer to rediscovery must not end the sync thread."""
        if not self._unreachable:
            return True
        try:
            if self._on_reconnect is not None:
                self._on_reconnect()
        except Exception as e:
            self.error = f"after the API server came back: {_describe(e)}"
            self._count("sync_error")
            log.warning(
                "slice publisher reconnect failed node=%s driver=%s error=%s",
                self.node_name,
                self.driver_name,
                self.error,
                exc_info=e,
                extra={"node": self.node_name, "driver": self.driver_name},
            )
            return False
        self._unreachable = False
        return True

    def _fail(self, message: str, *, permanent: bool) -> None:
        self.error = message
        self._count("sync_error")
        level = logging.ERROR if permanent else logging.WARNING
        log.log(
            level,
            "slice publishing failed node=%s driver=%s permanent=%s error=%s",
            self.node_name,
            self.driver_name,
            permanent,
            message,
            extra={"node": self.node_name, "driver": self.driver_name, "permanent": permanent},
        )

    def _sync(self) -> None:
        with self._cond:
            desired, version = self._desired, self._version
        if desired is None:
            return
        if self._desired_digest is None or self._desired_digest[0] != version:
            self._desired_digest = (version, slice_diff.digest(desired))
        desired_digest = self._desired_digest[1]
        node_uid = self._node_uid()
        existing = self._list()
        p = slice_diff.plan(
            desired,
            existing,
            node_name=self.node_name,
            node_uid=node_uid,
            known_generation=self.generation,
            known_digest=self._published_digest,
            desired_digest=desired_digest,
        )
        self._count("sync")
        if not p.empty:
            self._apply(p)
            if p.bumped:
                self._count("generation_bump")
            log.info(
                "slices published node=%s driver=%s generation=%d created=%d updated=%d deleted=%d",
                self.node_name,
                self.driver_name,
                p.generation,
                len(p.create),
                len(p.replace),
                len(p.delete),
                extra={"node": self.node_name, "generation": p.generation},
            )
        self.generation = p.generation
        self._published_digest = desired_digest
        self.published = True
        with self._cond:
            if version == self._version:
                self._published_version = version
            self._cond.notify_all()

    def _apply(self, p: slice_diff.Plan) -> None:
        writes: list[tuple[str, str, Json, str]] = [
            ("POST", SLICES, body, "slice_created") for body in p.create
        ]
        writes += [
            ("PUT", f"{SLICES}/{body['metadata']['name']}", body, "slice_updated")
            for body in p.replace
        ]
        try:
            self._write_all(writes)
        except FieldDroppedError:
            self._withdraw()
            raise
        for name in p.delete:
            self._delete(name)

    def _write_all(self, writes: Sequence[tuple[str, str, Json, str]]) -> None:
        """Each write, read back and checked; up to :data:`WRITERS` at once (a pool's slices
        are independent objects, and a scheduler uses the pool only once every slice of its
        generation is there). Every write is tried; the first failure is raised after."""

        def write(method: str, path: str, body: Json, event: str) -> None:
            got = self._call(method, path, body)
            self._count(event)
            self._check_kept(body, got)

        if len(writes) <= 1:
            for w in writes:
                write(*w)
            return
        with ThreadPoolExecutor(min(WRITERS, len(writes)), "slice-write") as pool:
            done = [pool.submit(write, *w) for w in writes]
        errors = [e for e in (f.exception() for f in done) if e is not None]
        if errors:  # a dropped field first: it withdraws the pool
            raise next((e for e in errors if isinstance(e, FieldDroppedError)), errors[0])

    def _check_kept(self, body: Json, got: Json) -> None:
        want = slice_diff.content(body["spec"])
        have = slice_diff.content(got.get("spec", {}), like=body["spec"])
        lost = slice_diff.lost_fields(want, have)
        if lost:
            self._count("field_dropped")
            shown = ", ".join(lost[:5]) + (f" and {len(lost) - 5} more" if len(lost) > 5 else "")
            raise FieldDroppedError(
                f"ResourceSlice {body['metadata']['name']}: the API server did not keep {shown}; "
                "is a DRA feature gate (DRAPartitionableDevices, DRADeviceTaints, ...) off? "
                "The pool is withdrawn until the slices can be stored as written"
            )

    def _withdraw(self) -> None:
        """Delete every slice of the pool: publishing part of a device's truth is unsafe."""
        for obj in self._list():
            self._delete(obj["metadata"]["name"])
        self._published_digest = None

    def _delete(self, name: str) -> None:
        try:
            self._call("DELETE", f"{SLICES}/{name}")
            self._count("slice_deleted")
        except ApiError as e:
            if e.status != 404:
                raise

    def _node_uid(self) -> str:
        try:
            node = self._call("GET", f"/api/v1/nodes/{self.node_name}")
        except ApiError as e:
            if e.status == 404:
                raise ApiUnavailable(
                    f"Node {self.node_name!r} does not exist; its ResourceSlices need it as owner"
                ) from e
            raise
        return str(node["metadata"]["uid"])

    def _list(self) -> list[Json]:
        result = self._call("GET", SLICES, query={"fieldSelector": self._selector})
        items: list[Json] = result.get("items") or []
        return items

    def _call(
        self,
        method: str,
        path: str,
        body: Json | None = None,
        query: Mapping[str, str] | None = None,
    ) -> Json:
        try:
            return self._kube.request(method, path, body=body, query=query, timeout_s=self._timeout)
        except ApiError as e:
            if e.status == 422:
                raise ConfigError(f"API server rejected ResourceSlice: {_reason(e)}") from e
            raise

    # --- watch ------------------------------------------------------------------------

    def _watch_loop(self) -> None:
        while not self._stop.is_set():
            try:
                watch = self._kube.watch(
                    SLICES,
                    {"fieldSelector": self._selector},
                    timeout_s=self._watch_seconds,
                    connect_timeout_s=self._timeout,
                )
                self._watch = watch
                if self._stop.is_set():
                    return
                self._wake.set()  # slices may have gone while no watch was open
                for event in watch:
                    if self._stop.is_set():
                        break
                    self._on_watch_event(event)
                self._watch_backoff.reset()
            except Exception as e:
                if self._stop.is_set():
                    return
                log.debug("slice watch interrupted node=%s error=%s", self.node_name, _describe(e))
                self._stop.wait(self._watch_backoff.next())
            finally:
                self._close_watch()

    def _on_watch_event(self, event: Json) -> None:
        if event.get("type") in {"ADDED", "MODIFIED", "DELETED"}:
            self._wake.set()

    def _close_watch(self) -> None:
        watch, self._watch = self._watch, None
        if watch is not None:
            watch.close()


def _reason(e: ApiError) -> str:
    try:
        body = json.loads(e.body or "{}")
    except ValueError:
        return f"{e.status} {e.reason}"
    return str(body.get("message") or f"{e.status} {e.reason}")


def _describe(e: BaseException) -> str:
    if isinstance(e, ApiError):
        return f"HTTP {e.status}: {_reason(e)}"
    return f"{type(e).__name__}: {e}"
