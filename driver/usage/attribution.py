"""Per-claim GPU usage attribution: who held which device, and who used it.

Two quantities are integrated over time for every prepared claim:

* **allocated** GPU-seconds: wall time the claim held a device times its share
  of that device (:meth:`HeldDevice.fraction`);
* **measured** GPU-seconds and memory-byte-seconds: the device's sampled
  utilisation and memory, split among the claims that hold it by the usage of
  their own processes (found through each process's cgroup, see
  :mod:`driver.pod_cgroup`).

The split never copies a device's reading to every consumer. What the device
did not do is ``idle``; what processes outside every claim did is
``unattributed``; the consumers' parts, unattributed and idle add up to the
device's time (:func:`split_device`). MIG devices are measured on their own
UUID, so a MIG slice's reading is its own; NVML has no utilisation for them, so
their measured time is occupancy (a process of the claim resident on it).

:func:`split_device` and :func:`integrate` are pure. :class:`UsageSampler`
reads the NVML facade and the allocation records and hands each interval to a
:class:`UsageSink` (the metrics).
"""

from __future__ import annotations

import itertools
import logging
import math
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

from driver.errors import TrancheError
from driver.nvml.types import DeviceUsage, is_mig_uuid
from driver.pod_cgroup import parse_cgroup

log = logging.getLogger(__name__)

SharingMode = Literal["exclusive", "mig", "mps", "time-slicing", "capacity"]

MIG_COMPUTE_SLICES = 7  # A100, H100, H200, B200; an A30 has 4


@dataclass(frozen=True)
class HeldDevice:
    """One device a claim holds, measured on ``uuid`` (a GPU UUID, or a MIG device's own).

    ``size`` is the device in physical GPUs (1 for a GPU, compute slices / 7 for
    a MIG device); ``share`` the claim's part of the device (None: 1/N of the
    claims holding it). Allocated GPU-seconds are held time * size * share;
    measured GPU-seconds are held time * size * the claim's busy fraction, so
    both count in whole-GPU units.
    """

    uuid: str
    device_name: str
    mode: SharingMode
    share: float | None = 1.0
    size: float = 1.0

    @classmethod
    def whole(cls, uuid: str, device_name: str) -> HeldDevice:
        return cls(uuid, device_name, "exclusive")

    @classmethod
    def mig(
        cls,
        uuid: str,
        device_name: str,
        slices: int,
        total: int = MIG_COMPUTE_SLICES,
        share: float | None = 1.0,
    ) -> HeldDevice:
        """A MIG device: its compute slices over the parent's (7 on A100/H100/H200)."""
        return cls(uuid, device_name, "mig", share, slices / total)

    @classmethod
    def mps(cls, uuid: str, device_name: str, thread_percentage: float) -> HeldDevice:
        """An MPS share of a GPU held by several claims: its active-thread percentage."""
        return cls(uuid, device_name, "mps", thread_percentage / 100.0)

    @classmethod
    def time_sliced(cls, uuid: str, device_name: str) -> HeldDevice:
        """A time-slice: 1/N of the device, N the claims holding it at the time."""
        return cls(uuid, device_name, "time-slicing", None)

    @classmethod
    def capacity(cls, uuid: str, device_name: str, consumed: float, total: float) -> HeldDevice:
        """A consumable-capacity share: consumed over the device's capacity."""
        return cls(uuid, device_name, "capacity", consumed / total)

    def fraction(self, holders: int) -> float:
        """The claim's allocated part of one physical GPU, ``holders`` claims holding the device."""
        share = self.share if self.share is not None else 1.0 / max(holders, 1)
        return self.size * share


@dataclass(frozen=True)
class ClaimAllocation:
    """What attribution needs from a claim's allocation record (the checkpoint keeps it)."""

    claim_uid: str
    namespace: str
    name: str
    tenant: str
    pod_uids: frozenset[str]  # from status.reservedFor
    devices: tuple[HeldDevice, ...]
    prepared_at: float  # seconds since the epoch
    unprepared_at: float | None = None


@dataclass(frozen=True)
class DeviceSplit:
    """One device reading split into its consumers' parts, unattributed and idle.

    ``busy`` maps claim UID to its fraction of the device's time (0..1);
    ``pod_busy`` splits the same by pod (the pods of one shared claim).
    ``sum(busy.values()) + unattributed + idle == 1``.
    """

    uuid: str
    busy: Mapping[str, float]
    pod_busy: Mapping[str, float]  # pod UID -> its fraction, where processes have samples
    memory_bytes: Mapping[str, int]
    unattributed: float
    idle: float
    unattributed_memory_bytes: int


def _pods_by_claim(consumers: Sequence[ClaimAllocation]) -> dict[str, frozenset[str]]:
    merged: dict[str, frozenset[str]] = {}
    for c in consumers:
        merged[c.claim_uid] = merged.get(c.claim_uid, frozenset()) | c.pod_uids
    return merged


def reports_utilisation(uuid: str) -> bool:
    """Whether NVML reports utilisation for the device: not for MIG devices."""
    return not is_mig_uuid(uuid)


def split_device(usage: DeviceUsage, consumers: Sequence[ClaimAllocation]) -> DeviceSplit:
    """Split one device reading among the claims that hold the device.

    The device's busy fraction ``U`` is shared in proportion to the SM
    utilisation NVML reports for each process (a process in a pod of two
    claims counts half to each). When no process has a sample, a sole consumer
    gets all of ``U``; several consumers share it by process memory; with no
    process at all it is unattributed. A MIG device has no utilisation in NVML:
    it counts as busy while any process runs on it (occupancy) and idle
    otherwise. Memory is each claim's processes' memory;
    the rest of the device's used memory (contexts, other processes) is
    unattributed.
    """
    if reports_utilisation(usage.uuid):
        busy_total = min(max(usage.gpu_util_percent / 100.0, 0.0), 1.0)
    else:
        busy_total = 1.0 if usage.processes else 0.0
    pods = _pods_by_claim(consumers)
    sm: dict[str, float] = dict.fromkeys(pods, 0.0)
    mem: dict[str, float] = dict.fromkeys(pods, 0.0)
    pod_sm: dict[str, float] = {}
    other_sm = 0.0
    other_mem = 0.0
    for proc in usage.processes:
        where = parse_cgroup(proc.cgroup)
        owners = [uid for uid, p in pods.items() if where is not None and where.pod_uid in p]
        if where is None or not owners:
            other_sm += proc.sm_util_percent
            other_mem += proc.used_memory_bytes
            continue
        pod_sm[where.pod_uid] = pod_sm.get(where.pod_uid, 0.0) + proc.sm_util_percent
        for owner in owners:
            sm[owner] += proc.sm_util_percent / len(owners)
            mem[owner] += proc.used_memory_bytes / len(owners)

    weights, other_weight = sm, other_sm
    sampled = sum(sm.values()) + other_sm
    if sampled <= 0:
        if len(pods) == 1:
            weights, other_weight = dict.fromkeys(pods, 1.0), 0.0
        else:
            weights, other_weight = mem, other_mem
    weight_total = sum(weights.values()) + other_weight
    if weight_total > 0:
        busy = {uid: busy_total * w / weight_total for uid, w in weights.items()}
        unattributed = busy_total * other_weight / weight_total
    else:
        busy = {uid: 0.0 for uid in sm}
        unattributed = busy_total

    memory = {uid: round(m) for uid, m in mem.items()}
    return DeviceSplit(
        uuid=usage.uuid,
        busy={uid: busy.get(uid, 0.0) for uid in sm},
        pod_busy={pod: busy_total * v / sampled for pod, v in pod_sm.items()} if sampled else {},
        memory_bytes=memory,
        unattributed=unattributed,
        idle=1.0 - busy_total,
        unattributed_memory_bytes=max(usage.memory_used_bytes - sum(memory.values()), 0),
    )


@dataclass(frozen=True)
class ClaimIncrement:
    """A claim's usage over one interval, in seconds and byte-seconds."""

    claim_uid: str
    namespace: str
    name: str
    tenant: str
    allocated_s: float
    measured_s: float
    memory_byte_s: float
    unmeasured_s: float  # the part of allocated_s on devices NVML could not read this interval


@dataclass(frozen=True)
class DeviceIncrement:
    """A held device over one interval, in GPU-seconds (a MIG device counts its size).

    A device NVML could not read is still held (the checkpoint says who held it); its
    idle and unattributed parts are unknown, so 0, ``idle_ratio`` is NaN and all of its held
    time is ``unmeasured_s`` (a lost GPU, a driver error): an idle share is of
    ``held_s - unmeasured_s``.
    """

    uuid: str
    held_s: float
    idle_s: float
    unattributed_s: float
    idle_ratio: float
    unmeasured_s: float = 0.0


@dataclass(frozen=True)
class IntervalUsage:
    start: float
    end: float
    claims: tuple[ClaimIncrement, ...] = ()
    devices: tuple[DeviceIncrement, ...] = field(default_factory=tuple)


def _held_span(record: ClaimAllocation, start: float, end: float) -> tuple[float, float]:
    """When, within ``(start, end]``, the record held its devices (an empty span if never)."""
    until = end if record.unprepared_at is None else min(end, record.unprepared_at)
    return max(start, record.prepared_at), until


def _held_seconds(record: ClaimAllocation, start: float, end: float) -> float:
    since, until = _held_span(record, start, end)
    return max(until - since, 0.0)


def _holding_units(held: Sequence[ClaimAllocation], uuid: str) -> int:
    """The holdings of ``uuid`` a 1/N share divides by: each claim counts its devices on it.

    A claim with two shares of one device (two requests, or a count of two) holds two of its
    N parts; a claim prepared again (two records) still counts once.
    """
    per_claim: dict[str, int] = {}
    for record in held:
        mine = sum(1 for d in record.devices if d.uuid == uuid)
        per_claim[record.claim_uid] = max(per_claim.get(record.claim_uid, 0), mine)
    return sum(per_claim.values())


@dataclass(frozen=True)
class _Holding:
    """How long a device was held in an interval, and each record's allocated part of it."""

    held_s: float  # wall time at least one claim held the device
    allocated_s: dict[int, float]  # record index -> its allocated GPU-seconds on the device


def _holding(
    uuid: str, held: Sequence[tuple[int, ClaimAllocation, tuple[float, float]]]
) -> _Holding:
    """Walk the interval in spans over which the device's holders do not change.

    A 1/N share counts N at each moment, not over the whole interval: two claims that
    follow each other on a device within one interval never shared it, so each is
    allocated all of its own held time, and the device was held for the time of both.
    """
    edges = sorted({t for _, _, span in held for t in span})
    held_s = 0.0
    allocated: dict[int, float] = {}
    for since, until in itertools.pairwise(edges):
        present = [(i, r) for i, r, (a, b) in held if a <= since and until <= b]
        if not present:
            continue
        seconds = until - since
        held_s += seconds
        units = _holding_units([r for _, r in present], uuid)
        for i, record in present:
            part = sum(d.fraction(units) for d in record.devices if d.uuid == uuid)
            allocated[i] = allocated.get(i, 0.0) + seconds * part
    return _Holding(held_s, allocated)


def integrate(
    start: float,
    end: float,
    records: Iterable[ClaimAllocation],
    usages: Mapping[str, DeviceUsage | None],
) -> IntervalUsage:
    """Integrate allocation and measured usage over ``(start, end]``.

    The reading taken at ``end`` stands for the whole interval (rectangle rule,
    as a Prometheus ``rate`` does); allocation is exact to the second (:func:`_holding`).
    Every claim that held a device at any time
    in the interval gets an increment, zero or not (a claim prepared again after
    an unprepare has two records: each counts its own held time); ``usages`` lacks (or has
    None for) a device NVML could not read: it is still held and allocated (holding is
    known from the records, not from NVML), and the claims' allocated time on it is also
    reported as ``unmeasured_s``.
    """
    active = [(r, span) for r in records if (span := _held_span(r, start, end))[1] > span[0]]
    holders: dict[str, list[tuple[int, ClaimAllocation, tuple[float, float]]]] = {}
    for i, (record, span) in enumerate(active):
        for uuid in dict.fromkeys(d.uuid for d in record.devices):
            holders.setdefault(uuid, []).append((i, record, span))
    holdings = {uuid: _holding(uuid, held) for uuid, held in holders.items()}

    splits: dict[str, DeviceSplit] = {}
    devices: list[DeviceIncrement] = []
    for uuid in sorted(holders):
        size = next(d.size for _, r, _ in holders[uuid] for d in r.devices if d.uuid == uuid)
        device_s = holdings[uuid].held_s * size
        usage = usages.get(uuid)
        if usage is None:
            devices.append(DeviceIncrement(uuid, device_s, 0.0, 0.0, math.nan, device_s))
            continue
        split = split_device(usage, [r for _, r, _ in holders[uuid]])
        splits[uuid] = split
        devices.append(
            DeviceIncrement(
                uuid=uuid,
                held_s=device_s,
                idle_s=device_s * split.idle,
                unattributed_s=device_s * split.unattributed,
                idle_ratio=split.idle,
            )
        )

    claims: list[ClaimIncrement] = []
    for i, (record, (since, until)) in enumerate(active):
        seconds = until - since
        allocated = measured = memory = unmeasured = 0.0
        for device in {d.uuid: d for d in record.devices}.values():  # two shares: one reading
            mine = holdings[device.uuid].allocated_s.get(i, 0.0)
            allocated += mine
            part = splits.get(device.uuid)
            if part is None:
                unmeasured += mine
                continue
            measured += seconds * device.size * part.busy[record.claim_uid]
            memory += seconds * part.memory_bytes[record.claim_uid]
        claims.append(
            ClaimIncrement(
                claim_uid=record.claim_uid,
                namespace=record.namespace,
                name=record.name,
                tenant=record.tenant,
                allocated_s=allocated,
                measured_s=measured,
                memory_byte_s=memory,
                unmeasured_s=unmeasured,
            )
        )
    return IntervalUsage(start=start, end=end, claims=tuple(claims), devices=tuple(devices))


class UsageSource(Protocol):
    """The NVML facade's usage read: one device (GPU or MIG) by UUID."""

    def device_usage(self, uuid: str) -> DeviceUsage: ...


class UsageSink(Protocol):
    """Where sampled intervals go (:class:`driver.metrics.Metrics`)."""

    def add_usage(self, usage: IntervalUsage) -> None: ...

    def count_error(self, reason: str) -> None: ...


RecordsProvider = Callable[[], Iterable[ClaimAllocation]]


class UsageSampler:
    """Samples every held device and feeds the integrated interval to the metrics.

    The first :meth:`sample_once` only sets the starting point: a restarted
    plugin counts from then on, so it never bills again what the process before
    it exported. Records of unprepared claims should stay in the provider (with
    ``unprepared_at``) until one sample after they ended, so their last partial
    interval is counted; a record that vanishes is counted up to the sample
    before.

    A device that disappears with its claim (a dynamic MIG device, destroyed by the
    unprepare) cannot be read by the next sample: :meth:`read_final` reads it first, and
    that reading stands for its last interval (the claim held it until the unprepare; the
    reading is the last one NVML had). It is kept in memory only: a plugin that dies before
    the next sample loses that interval, as it loses every interval since its last sample.
    """

    def __init__(
        self,
        nvml: UsageSource,
        records_provider: RecordsProvider,
        metrics: UsageSink,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._nvml = nvml
        self._records = records_provider
        self._metrics = metrics
        self._clock = clock
        self._last: float | None = None
        # UUID -> (when, reading; None: NVML could not read it) of devices read by
        # read_final: used for their last interval, dropped by the sample after it.
        self._final: dict[str, tuple[float, DeviceUsage | None]] = {}
        self._final_lock = threading.Lock()

    def read_final(self, uuids: Iterable[str]) -> None:
        """Read devices their claim's unprepare is about to destroy (a dynamic MIG device):
        the samples that count their last held time use this reading, NVML having none by
        then. A few NVML calls per device, on the unprepare's path; never raises (a failed
        read leaves that time unmeasured, counted as an NVML error once)."""
        for uuid in uuids:
            try:
                usage: DeviceUsage | None = self._nvml.device_usage(uuid)
            except TrancheError as err:
                log.warning("final usage read failed device=%s error=%s", uuid, err)
                self._metrics.count_error("nvml")
                usage = None
            with self._final_lock:
                self._final[uuid] = (self._clock(), usage)

    def sample_once(self) -> IntervalUsage | None:
        """Sample now; return the interval since the previous sample (None on the first)."""
        now = self._clock()
        start = self._last
        if start is None or now <= start:
            self._last = now if start is None else max(start, now)
            return None
        records = list(self._records())
        held = [r for r in records if _held_seconds(r, start, now) > 0]
        uuids = sorted({d.uuid for r in held for d in r.devices})
        with self._final_lock:
            final = dict(self._final)
        usages: dict[str, DeviceUsage | None] = {}
        for uuid in uuids:
            if uuid in final and _all_ended(held, uuid):
                usages[uuid] = final[uuid][1]  # destroyed since: its last reading
                continue
            try:
                usages[uuid] = self._nvml.device_usage(uuid)
            except TrancheError as err:
                with self._final_lock:  # an unprepare may have read it since the copy
                    last = self._final.get(uuid)
                if last is not None:  # destroyed by an unprepare not yet recorded
                    usages[uuid] = last[1]
                    continue
                log.warning("usage read failed device=%s error=%s", uuid, err)
                self._metrics.count_error("nvml")
                usages[uuid] = None
        interval = integrate(start, now, records, usages)
        self._metrics.add_usage(interval)
        self._last = now
        with self._final_lock:  # read by the interval's start: no later interval needs it
            for uuid in [u for u, (when, _) in self._final.items() if when <= start]:
                del self._final[uuid]
        return interval


def _all_ended(records: Sequence[ClaimAllocation], uuid: str) -> bool:
    """Whether every record holding ``uuid`` was unprepared (not one whose unprepare failed
    after :meth:`UsageSampler.read_final`: its device is still there to be read)."""
    return all(
        r.unprepared_at is not None for r in records if any(d.uuid == uuid for d in r.devices)
    )
