"""``status.devices`` of prepared claims: which device, in which mode, with which limits.

After a successful prepare the plugin writes one entry per prepared device
(driver, pool, device, shareID; ``data`` with the device UUID, the GPU, the
mode and the limits in force; a ``Ready`` condition), keeping other drivers'
entries. It reads the claim **as protobuf** and updates ``status`` with the same
bytes but ``status.devices`` (:mod:`driver.kube.wire`), guarded by the
resourceVersion the read returned (retried when the claim changed). Any JSON write
(JSON, merge, strategic or apply patch alike, and an update) makes the API server
re-encode the allocation's opaque config as compact JSON, and the v1.37.2 API
server then refuses it ("status.allocation: field cannot be modified once set")
for every claim whose config was not sent as compact JSON, e.g. by the Python
kubernetes client; in protobuf the config is a bytes field that stays as it was. Since
Kubernetes 1.36 the service account needs ``update``/``patch`` on
``resourceclaims/status`` and, on ``resourceclaims/driver``, the verbs
``associated-node:update`` and ``associated-node:patch``.

A failure to write is logged and counted (``on_error``); it never fails the
prepare: the claim is prepared, only its status is late.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

from driver.api import ClaimRef, DraDriver, PrepareResult, UnprepareResult
from driver.checkpoint.store import Checkpoint, CheckpointData, ClaimRecord
from driver.errors import ApiUnavailable
from driver.kube import wire
from driver.kube.http import RESOURCE_V1, ApiError, ApiUnreachable, KubeClient
from driver.prepare.config import MpsConfig
from driver.prepare.plan import CreateMigDevice, Plan, PlannedDevice, SetTimeSlice, StartMps
from driver.sharing.mps import device_limit

log = logging.getLogger(__name__)

WRITE_TIMEOUT_S = 10.0
YIELD_S = 5.0
QUIET_S = 0.05
CONFLICT_RETRIES = 3


def _mps_limits(mps: MpsConfig, device: PlannedDevice, plan: Plan) -> dict[str, Any]:
    """The MPS limits in force on ``device``: its pinned-memory limit is the claim's entry
    for it in ``defaultPerDevicePinnedMemoryLimit`` where there is one, as the container's
    ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` has it."""
    out: dict[str, Any] = {}
    if mps.default_active_thread_percentage is not None:
        out["activeThreadPercentage"] = mps.default_active_thread_percentage
    limit = device_limit(mps, device, plan)
    if limit is not None:
        out["pinnedDeviceMemoryLimitBytes"] = limit
    return out


def device_data(record: ClaimRecord, device: PlannedDevice) -> dict[str, Any]:
    """What a user needs to know about one prepared device (``status.devices[].data``)."""
    data: dict[str, Any] = {
        "uuid": record.device_uuids.get(device.device, device.uuid or device.gpu_uuid),
        "gpuUUID": device.gpu_uuid,
        "mode": "MIG" if device.type == "mig" else device.sharing.strategy,
    }
    if device.type == "mig" and device.sharing.strategy != "Exclusive":
        data["sharing"] = device.sharing.strategy
    for step in record.plan.steps:
        if isinstance(step, CreateMigDevice) and step.device == device.device:
            data["migProfile"] = step.profile
            data["migPlacementStart"] = step.start
        elif isinstance(step, SetTimeSlice) and step.gpu_uuid == device.gpu_uuid:
            if device.sharing.strategy == "TimeSlicing":
                data["timeSliceInterval"] = step.interval
        elif isinstance(step, StartMps) and device.device in step.devices:
            data["mps"] = _mps_limits(step.mps, device, record.plan)
    return data


def device_statuses(
    record: ClaimRecord, driver_name: str, now: datetime | None = None
) -> list[dict[str, Any]]:
    """The ``status.devices`` entries of one prepared claim."""
    stamp = (now or datetime.now(UTC)).strftime("%Y-%m-%dT%H:%M:%SZ")
    by_name = {d.device: d for d in record.plan.devices}
    out = []
    for prepared in record.devices:
        planned = by_name[prepared.device_name]
        entry: dict[str, Any] = {
            "driver": driver_name,
            "pool": prepared.pool_name,
            "device": prepared.device_name,
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "Prepared",
                    "message": f"prepared on node {prepared.pool_name}",
                    "lastTransitionTime": stamp,
                }
            ],
            "data": device_data(record, planned),
        }
        if prepared.share_id:
            entry["shareID"] = prepared.share_id
        out.append(entry)
    return out


def _wire_entry(entry: dict[str, Any]) -> bytes:
    """One ``status.devices`` entry (as :func:`device_statuses` builds it) in protobuf."""
    conditions = [
        wire.Condition(
            c["type"],
            c["status"],
            c["reason"],
            c["message"],
            datetime.strptime(c["lastTransitionTime"], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC),
        )
        for c in entry.get("conditions", [])
    ]
    data = entry.get("data")
    return wire.device_status(
        (entry["driver"], entry["pool"], entry["device"], entry.get("shareID") or ""),
        conditions,
        json.dumps(data, separators=(",", ":")).encode() if data is not None else None,
    )


def keep_others(driver_name: str, mine: list[dict[str, Any]]) -> Callable[[wire.DeviceKey], bool]:
    """Which ``status.devices`` entries a write keeps: other drivers' entries (those of this
    driver are all replaced by ``mine``)."""
    ours = wire.keys_of(mine)
    return lambda key: key[0] != driver_name and key not in ours


class ClaimStatusWriter:
    """Writes ``status.devices`` of prepared claims; never raises."""

    def __init__(
        self,
        kube: KubeClient,
        driver_name: str,
        *,
        on_error: Callable[[str], None] | None = None,
        timeout_s: float = WRITE_TIMEOUT_S,
    ) -> None:
        self._kube = kube
        self._driver_name = driver_name
        self._on_error = on_error or (lambda _reason: None)
        self._timeout_s = timeout_s

    def write(self, ref: ClaimRef, record: ClaimRecord) -> bool:
        """Write the entries of ``record``; False (logged, counted) when the write failed."""
        start = time.monotonic()
        mine = device_statuses(record, self._driver_name)
        keep = keep_others(self._driver_name, mine)
        entries = [_wire_entry(entry) for entry in mine]
        try:
            for attempt in range(CONFLICT_RETRIES):
                envelope, claim_raw = self._read(ref)
                if wire.claim_meta(wire.fields(claim_raw)).uid != ref.uid:
                    self._failed(ref, "gone", "the claim was deleted and recreated")
                    return False
                updated = wire.with_status_devices(claim_raw, entries, keep)
                try:
                    self._kube.request(
                        "PUT",
                        f"{_path(ref)}/status",
                        body=wire.wrap(envelope, updated),
                        content_type=wire.CONTENT_TYPE,
                        timeout_s=self._timeout_s,
                    )
                    break
                except ApiError as e:
                    # 409: the claim changed since the read (its resourceVersion moved)
                    if e.status != 409 or attempt == CONFLICT_RETRIES - 1:
                        raise
        except wire.WireError as e:
            self._failed(ref, "bad-answer", f"the claim read as protobuf is not one: {e}")
            return False
        except ApiError as e:
            reason = "conflict" if e.status == 409 else f"http-{e.status}"
            self._failed(ref, reason, f"HTTP {e.status} {e.reason}: {e.message[:300]}")
            return False
        except ApiUnreachable as e:
            self._failed(ref, "unreachable", e.detail)
            return False
        except (ApiUnavailable, ValueError) as e:
            self._failed(ref, "unreachable", f"{type(e).__name__}: {e}")
            return False
        log.info(
            "claim status written claim_uid=%s claim=%s/%s devices=%d seconds=%.3f",
            ref.uid,
            ref.namespace,
            ref.name,
            len(record.devices),
            time.monotonic() - start,
        )
        return True

    def _read(self, ref: ClaimRef) -> tuple[list[wire.Field], bytes]:
        """The claim as protobuf: its envelope's fields and its own bytes."""
        answer = self._kube.send(
            "GET", _path(ref), accept=wire.CONTENT_TYPE, timeout_s=self._timeout_s
        )
        if not answer.ok:
            raise ApiError("GET", _path(ref), answer)
        return wire.unwrap(answer.body)

    def write_prepared(self, ref: ClaimRef, checkpoint: Checkpoint) -> bool:
        """Look the claim up in the checkpoint and write its status (after a prepare)."""
        state, _ = checkpoint.load()
        record = state.claims.get(ref.uid)
        if record is None or record.state != "PrepareCompleted":
            self._failed(ref, "not-prepared", "the checkpoint has no completed prepare for it")
            return False
        return self.write(ref, record)

    def _failed(self, ref: ClaimRef, reason: str, detail: str) -> None:
        log.warning(
            "claim status not written claim_uid=%s claim=%s/%s reason=%s error=%s",
            ref.uid,
            ref.namespace,
            ref.name,
            reason,
            detail,
        )
        self._on_error(reason)


def _path(ref: ClaimRef) -> str:
    return f"{RESOURCE_V1}/namespaces/{ref.namespace}/resourceclaims/{ref.name}"


class StatusWritingDriver:
    """A :class:`driver.api.DraDriver` that writes ``status.devices`` after each prepare.

    The writes go to a small background pool: the kubelet's answer never waits
    for them, and a failed write is logged and counted, never a failed prepare.
    They also give way to the kubelet's calls: a write waits until no call has
    been in flight for ``quiet_s``, at most ``yield_s``, so pods starting one after
    another are not slowed by two API requests per claim competing for the
    interpreter (and the API server); their statuses follow.
    """

    def __init__(
        self,
        inner: DraDriver,
        writer: ClaimStatusWriter,
        records: Callable[[], CheckpointData],
        *,
        yield_s: float = YIELD_S,
        quiet_s: float = QUIET_S,
    ) -> None:
        self._inner = inner
        self._writer = writer
        self._records = records
        self._yield_s = yield_s
        self._quiet_s = quiet_s
        self._in_flight = 0
        self._waiting_for_calls = 0
        self._last_call = 0.0
        self._idle = threading.Condition()
        self._pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="claim-status")

    def prepare(self, claims: Sequence[ClaimRef]) -> dict[str, PrepareResult]:
        with self._call():
            results = self._inner.prepare(claims)
        done = [c for c in claims if c.uid in results and not results[c.uid].error]
        if done:
            self._submit(done)
        return results

    def _submit(self, claims: Sequence[ClaimRef]) -> None:
        try:
            self._pool.submit(self._write, claims)
        except RuntimeError:
            # Closed: this prepare outlasted the stop's grace, and gRPC cancelled the call
            # before it ended. The kubelet, never answered, prepares the claim again on the
            # next instance, which answers from the checkpoint and writes the status then.
            for ref in claims:
                log.info(
                    "claim status left to the kubelet's retry claim_uid=%s claim=%s/%s "
                    "reason=stopped",
                    ref.uid,
                    ref.namespace,
                    ref.name,
                )

    def unprepare(self, claims: Sequence[ClaimRef]) -> dict[str, UnprepareResult]:
        with self._call():
            return self._inner.unprepare(claims)

    @contextlib.contextmanager
    def _call(self) -> Iterator[None]:
        with self._idle:
            self._in_flight += 1
        try:
            yield
        finally:
            with self._idle:
                self._in_flight -= 1
                self._last_call = time.monotonic()
                # Only a writer waiting for the calls to end needs waking; one waiting out
                # the quiet time wakes by itself (a wake-up per call cost the calls time).
                if not self._in_flight and self._waiting_for_calls:
                    self._idle.notify_all()

    def _write(self, claims: Sequence[ClaimRef]) -> None:
        deadline = time.monotonic() + self._yield_s
        with self._idle:
            while (now := time.monotonic()) < deadline:
                if self._in_flight:
                    self._waiting_for_calls += 1
                    try:
                        self._idle.wait(deadline - now)
                    finally:
                        self._waiting_for_calls -= 1
                elif (quiet := now - self._last_call) < self._quiet_s:
                    self._idle.wait(min(deadline - now, self._quiet_s - quiet))
                else:
                    break
        state = self._records()
        for ref in claims:
            record = state.claims.get(ref.uid)
            if record is not None:
                self._writer.write(ref, record)

    def close(self) -> None:
        """Write what is queued; a prepare that ends after this writes nothing (it was cut:
        the gRPC server stopped before this is called)."""
        self._pool.shutdown(wait=True)
