"""GPU health: NVML events and probes in, device taints and health out.

:class:`HealthMonitor` keeps, per physical GPU, the faults that NVML reported
(classified by :mod:`driver.health.policy`) and lifts each one when the GPU is
healthy again. It is pure state plus a lock: the thread that feeds it lives in
:mod:`driver.health.watch`, time comes from an injectable :class:`Clock`.

Outputs:

* :meth:`HealthMonitor.taints_by_device`: ``resource.k8s.io/v1`` ``DeviceTaint``
  dicts for every device that lives on a faulty GPU (the GPU, its MIG devices,
  its shares), or only for the MIG device of a fault NVML attributes to one MIG
  instance, for the ResourceSlice builder;
* :meth:`HealthMonitor.snapshot` / :meth:`HealthMonitor.wait_for_change`: the
  :class:`driver.api.HealthSource` behind the kubelet health stream;
* listeners (:class:`HealthChange`) for Events, and optional metrics.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Literal, Protocol

from driver.api import DeviceHealth, HealthSnapshot
from driver.devices.inventory import Inventory
from driver.health.policy import (
    RECOVERY_ACTION_CLASS,
    SEVERITY,
    FaultClass,
    HealthPolicy,
    normalise_recovery_action,
    xid_meaning,
)
from driver.nvml.types import DeviceProbe, XidEvent

log = logging.getLogger(__name__)

TAINT_DOMAIN = "gpu.tranche.dev"
KEY_XID = f"{TAINT_DOMAIN}/xid"
KEY_ECC = f"{TAINT_DOMAIN}/ecc"
KEY_GPU_LOST = f"{TAINT_DOMAIN}/gpu-lost"
KEY_UNMONITORED = f"{TAINT_DOMAIN}/unmonitored"
KEY_EVENT = f"{TAINT_DOMAIN}/event"

# A device holds at most 16 taints (resource.k8s.io/v1 DeviceTaintsMaxLength; 4 on
# Kubernetes 1.34, where build_slices keeps the strongest); health keeps to half of them
# so other taints still fit.
MAX_HEALTH_TAINTS = 8
MAX_MESSAGE = 1024

ChangeKind = Literal["tainted", "escalated", "repeated", "healed"]


class Clock(Protocol):
    def now(self) -> float:
        """Seconds since the epoch."""
        ...


class SystemClock:
    def now(self) -> float:
        return time.time()


@dataclass
class Fault:
    """One active fault of one GPU; it becomes one taint on each of the GPU's devices, or on
    ``device`` alone (the MIG device of an instance-scoped fault)."""

    key: str
    value: str
    fault_class: FaultClass
    effect: str  # "None" | "NoSchedule" | "NoExecute"
    message: str
    time_added: float
    last_seen: float
    recovery_action: str | None = None
    count: int = 1
    device: str | None = None  # the one device it taints; None: every device of the GPU

    @property
    def ident(self) -> tuple[str, str, str | None]:
        return (self.key, self.value, self.device)

    def covers(self, device: str) -> bool:
        return self.device is None or self.device == device


@dataclass
class GpuState:
    uuid: str
    faults: dict[tuple[str, str, str | None], Fault] = field(default_factory=dict)
    answering: bool = True
    probe_failures: int = 0
    last_probe_ok: float | None = None
    # Last time the GPU was seen cleared: a reset, a lost GPU answering again, or a probe
    # that read NVML's recovery action NONE.
    cleared_at: float | None = None
    pending_action: str | None = None  # last non-NONE recovery action NVML reported


@dataclass(frozen=True)
class HealthChange:
    """A taint that appeared, grew stronger, repeated after the debounce time, or healed."""

    kind: ChangeKind
    node: str
    gpu_uuid: str
    devices: tuple[str, ...]
    key: str
    value: str
    effect: str
    message: str


class HealthMetricsSink(Protocol):
    def fault_observed(self, kind: str, xid: int, fault_class: FaultClass) -> None: ...

    def probe_failed(self) -> None: ...

    def state(
        self, devices_by_health: Mapping[str, int], taints: Mapping[tuple[str, str], int]
    ) -> None:
        """Devices per health state; device taints per (key, effect)."""
        ...


class FaultStore(Protocol):
    def load(self) -> dict[str, list[Fault]]: ...

    def save(self, faults: Mapping[str, Iterable[Fault]]) -> None: ...


def rfc3339(ts: float) -> str:
    return datetime.fromtimestamp(int(ts), tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def device_gpu_map(inventory: Inventory) -> dict[str, str]:
    """Every advertised device of ``inventory`` -> UUID of the physical GPU it lives on."""
    return {d.name: inventory.gpu_of(d.name).uuid for d in inventory.devices()}


MigSlot = tuple[str, int, int]  # (GPU UUID, GPU-instance profile id, first memory slice)


def mig_slot_map(inventory: Inventory) -> dict[MigSlot, str]:
    """Every advertised MIG device of ``inventory`` by its slot -> its device name: the
    device an event of one MIG instance (:attr:`XidEvent.mig_slot`) names."""
    return {(m.parent.uuid, m.profile.id, m.start): m.name for m in inventory.migs}


# Classes a fault of one MIG instance keeps to that instance's device (the catalog's
# RESTART_APP and IGNORE: the GPU is fine). The others ask for a reset of the whole GPU,
# which ends the work on every instance, or are not contained to the instance.
INSTANCE_CLASSES = (FaultClass.APPLICATION, FaultClass.INFORMATIONAL)


# Taint effects, weakest first.
EFFECT_RANK = {"None": 0, "NoSchedule": 1, "NoExecute": 2}


def _fault_order(f: Fault) -> tuple[int, float, str, str]:
    return (-SEVERITY[f.fault_class], -f.time_added, f.key, f.value)


def _device_faults(gpu: GpuState, device: str | None) -> list[Fault]:
    """The faults of ``gpu`` that taint ``device`` (None: those of the whole GPU), most
    severe first; of one key and value the strongest (the GPU's, on a tie) only."""
    best: dict[tuple[str, str], Fault] = {}
    for f in sorted(gpu.faults.values(), key=lambda f: f.device is not None):
        if (f.device is None or f.device == device) and (
            (kept := best.get((f.key, f.value))) is None
            or EFFECT_RANK.get(f.effect, 0) > EFFECT_RANK.get(kept.effect, 0)
        ):
            best[(f.key, f.value)] = f
    return sorted(best.values(), key=_fault_order)


class HealthMonitor:
    """Per-GPU fault state machine. Thread-safe; every public method takes the lock."""

    def __init__(
        self,
        policy: HealthPolicy,
        node_name: str,
        *,
        clock: Clock | None = None,
        store: FaultStore | None = None,
        metrics: HealthMetricsSink | None = None,
    ) -> None:
        self._policy = policy
        self._node = node_name
        self._clock: Clock = clock or SystemClock()
        self._store = store
        self._metrics = metrics
        self._lock = threading.RLock()
        self._changed = threading.Condition(self._lock)
        self._gpus: dict[str, GpuState] = {}
        self._devices: dict[str, str] = {}  # device name -> GPU UUID
        self._mig_slots: dict[MigSlot, str] = {}  # MIG slot -> device name
        self._listeners: list[Callable[[HealthChange], None]] = []
        self._snapshot = HealthSnapshot()
        if store is not None:
            self._restore(store.load())

    # ----- wiring -------------------------------------------------------------------------

    @property
    def policy(self) -> HealthPolicy:
        return self._policy

    def add_listener(self, listener: Callable[[HealthChange], None]) -> None:
        with self._lock:
            self._listeners.append(listener)

    def set_devices(
        self, devices: Mapping[str, str], mig_slots: Mapping[MigSlot, str] | None = None
    ) -> None:
        """Publish health for these devices: device name -> UUID of the GPU it lives on;
        ``mig_slots`` (:func:`mig_slot_map`) names the MIG devices that events of one MIG
        instance taint alone (without it, such events taint the whole GPU).

        Faults of GPUs that are no longer present are dropped.
        """
        with self._lock:
            self._devices = dict(devices)
            if mig_slots is not None:
                self._mig_slots = dict(mig_slots)
            gpus = set(self._devices.values())
            for uuid in gpus:
                self._gpus.setdefault(uuid, GpuState(uuid))
            for uuid in [u for u in self._gpus if u not in gpus]:
                if self._gpus[uuid].faults:
                    log.info("dropping faults of a GPU that is gone gpu=%s", uuid)
                del self._gpus[uuid]
            self._after_change([])

    def gpus(self) -> list[str]:
        with self._lock:
            return sorted(self._gpus)

    # ----- observations -------------------------------------------------------------------

    def observe_event(self, event: XidEvent) -> None:
        """Classify one NVML event and record it on its GPU (on all GPUs when unknown)."""
        with self._lock:
            now = self._clock.now()
            targets = self._targets(event.gpu_uuid)
            if event.kind == "recovered":
                for gpu in targets:
                    gpu.cleared_at = now
                    gpu.pending_action = None
                log.info("GPU reset seen gpu=%s", event.gpu_uuid)
                self._after_change(self._heal(now))
                return
            key, value, fault_class, message, action = self._classify(event)
            if self._metrics is not None:
                self._metrics.fault_observed(event.kind, event.code, fault_class)
            effect = self._policy.effect(fault_class)
            if effect == "Ignore":
                log.info(
                    "GPU event needs no taint gpu=%s kind=%s xid=%d class=%s",
                    event.gpu_uuid,
                    event.kind,
                    event.code,
                    fault_class.value,
                )
                return
            seen = Fault(key, value, fault_class, effect, message, now, now, action)
            seen.device = self._instance_device(event, fault_class, action)
            if fault_class is FaultClass.LOST:
                for gpu in targets:  # as a restored lost fault: a passing probe clears it
                    gpu.answering = False
            self._after_change([c for g in targets if (c := self._record(g, seen)) is not None])

    def observe_probe(self, probe: DeviceProbe, recovery_action: str | None = None) -> None:
        """Record a health probe; ``recovery_action`` is NVML's, where the probe read one."""
        with self._lock:
            now = self._clock.now()
            gpu_uuid = probe.uuid
            gpu = self._gpus.setdefault(gpu_uuid, GpuState(gpu_uuid))
            changes: list[HealthChange] = []
            if probe.healthy:
                if not gpu.answering:
                    log.info("GPU answers again gpu=%s", gpu_uuid)
                    gpu.cleared_at = now
                gpu.answering = True
                gpu.probe_failures = 0
                gpu.last_probe_ok = now
                action = normalise_recovery_action(recovery_action)
                if action == "NONE":
                    gpu.cleared_at = now
                    gpu.pending_action = None
                elif action is not None and action != "NONE":
                    gpu.pending_action = action
                changes.extend(self._heal(now))
            else:
                gpu.probe_failures += 1
                if self._metrics is not None:
                    self._metrics.probe_failed()
                if probe.lost or gpu.probe_failures >= self._policy.lost_after_probe_failures:
                    gpu.answering = False
                    message = f"GPU stopped answering: {probe.detail or 'probe failed'}"
                    effect = self._policy.effect(FaultClass.LOST)
                    if effect != "Ignore":
                        seen = Fault(KEY_GPU_LOST, "", FaultClass.LOST, effect, message, now, now)
                        change = self._record(gpu, seen)
                        if change is not None:
                            changes.append(change)
                else:
                    log.warning(
                        "GPU probe failed gpu=%s failures=%d detail=%s",
                        gpu_uuid,
                        gpu.probe_failures,
                        probe.detail,
                    )
            self._after_change(changes)

    def observe_watch_error(self, detail: str, gpus: Iterable[str] | None = None) -> None:
        """NVML events of ``gpus`` (default: all) cannot be watched: taint ``unmonitored``."""
        with self._lock:
            now = self._clock.now()
            msg = f"GPU events cannot be watched: {detail}"
            seen = Fault(KEY_UNMONITORED, "", FaultClass.INFORMATIONAL, "None", msg, now, now)
            wanted = None if gpus is None else set(gpus)
            targets = [g for u, g in self._gpus.items() if wanted is None or u in wanted]
            self._after_change([c for g in targets if (c := self._record(g, seen)) is not None])

    def observe_watch_ok(self, still_unmonitored: Iterable[str] = ()) -> None:
        """Events can be watched again (except on ``still_unmonitored``)."""
        keep = set(still_unmonitored)
        with self._lock:
            changes = []
            for gpu in [g for u, g in self._gpus.items() if u not in keep]:
                fault = gpu.faults.pop((KEY_UNMONITORED, "", None), None)
                if fault is not None:
                    changes.append(self._change("healed", gpu, fault))
            if changes:
                self._after_change(changes)

    def tick(self) -> None:
        """Lift the faults whose healing conditions now hold (call periodically)."""
        with self._lock:
            changes = self._heal(self._clock.now())
            if changes:
                self._after_change(changes)

    # ----- outputs ------------------------------------------------------------------------

    def taints_for_gpu(self, gpu_uuid: str, device: str | None = None) -> list[dict[str, str]]:
        """The taints of the GPU's devices; with ``device``, of that device (its GPU's faults
        and its own)."""
        with self._lock:
            gpu = self._gpus.get(gpu_uuid)
            if gpu is None:
                return []
            faults = _device_faults(gpu, device)[:MAX_HEALTH_TAINTS]
            out = []
            for f in sorted(faults, key=lambda f: (f.key, f.value)):
                taint = {"key": f.key, "effect": f.effect, "timeAdded": rfc3339(f.time_added)}
                if f.value:
                    taint["value"] = f.value
                out.append(taint)
            return out

    def taints_by_device(
        self, devices: Mapping[str, str] | None = None
    ) -> dict[str, list[dict[str, str]]]:
        """``DeviceTaint`` dicts per device name (device name -> GPU UUID; default: set_devices)."""
        with self._lock:
            mapping = self._devices if devices is None else devices
            return {name: self.taints_for_gpu(uuid, name) for name, uuid in mapping.items()}

    def faults(self, gpu_uuid: str) -> list[Fault]:
        with self._lock:
            gpu = self._gpus.get(gpu_uuid)
            return [replace(f) for f in gpu.faults.values()] if gpu else []

    def snapshot(self) -> HealthSnapshot:
        with self._lock:
            return self._snapshot

    def wait_for_change(self, after: HealthSnapshot, timeout: float) -> HealthSnapshot:
        with self._changed:
            self._changed.wait_for(lambda: self._snapshot != after, timeout=timeout)
            return self._snapshot

    # ----- internals ----------------------------------------------------------------------

    def _instance_device(
        self, event: XidEvent, fault_class: FaultClass, action: str | None
    ) -> str | None:
        """The one MIG device a fault of one MIG instance taints; None: every device of the
        GPU (a GPU-wide event, a class or recovery action that needs the whole GPU reset,
        or an instance that is no published device)."""
        if event.gi_id is None or fault_class not in INSTANCE_CLASSES:
            return None
        if action not in (None, "NONE"):
            return None
        slot = event.mig_slot
        name = self._mig_slots.get((event.gpu_uuid, *slot)) if slot is not None else None
        if name is None:
            log.warning(
                "event of an unknown MIG instance taints the whole GPU gpu=%s gi=%d",
                event.gpu_uuid,
                event.gi_id,
            )
        return name

    def _targets(self, gpu_uuid: str) -> list[GpuState]:
        if gpu_uuid in self._gpus:
            return [self._gpus[gpu_uuid]]
        if self._gpus:
            log.warning("event for an unknown GPU affects every GPU gpu=%r", gpu_uuid)
            return list(self._gpus.values())
        gpu = self._gpus.setdefault(gpu_uuid, GpuState(gpu_uuid))
        return [gpu]

    def _classify(self, event: XidEvent) -> tuple[str, str, FaultClass, str, str | None]:
        action = normalise_recovery_action(event.recovery_action)
        if event.kind == "xid":
            key, value = KEY_XID, str(event.code)
            message = f"XID {event.code} {xid_meaning(event.code)}"
            table_class = self._policy.xid_class(event.code)
            overridden = event.code in self._policy.xid_classes
        elif event.kind == "ecc-double-bit":
            key, value = KEY_ECC, "double-bit"
            message, table_class, overridden = "double-bit ECC error", FaultClass.UNCONTAINED, False
        elif event.kind == "ecc-single-bit":
            key, value = KEY_ECC, "single-bit"
            message, table_class = "single-bit ECC error (corrected)", FaultClass.INFORMATIONAL
            overridden = False
        elif event.kind == "gpu-lost":
            key, value = KEY_GPU_LOST, ""
            message, table_class, overridden = "GPU is lost", FaultClass.LOST, False
        else:
            key, value = KEY_EVENT, "unknown"
            message, table_class, overridden = (
                f"unknown GPU event {event.kind!r}",
                FaultClass.RESET,
                False,
            )
        if event.gi_id is not None:
            message += f" in MIG instance GI {event.gi_id}"
            if event.ci_id is not None:
                message += f" CI {event.ci_id}"
        fault_class = table_class
        if action not in (None, "NONE") and not overridden:
            # The action can only raise the class: NVML may still say NONE just after an
            # XID and announce the real action later with XID 154.
            message += f" (recovery action {action})"
            action_class = RECOVERY_ACTION_CLASS[action]
            fault_class = max(table_class, action_class, key=SEVERITY.__getitem__)
        return key, value, fault_class, message, action

    def _record(self, gpu: GpuState, seen: Fault) -> HealthChange | None:
        """Merge the fault just ``seen`` into ``gpu``; the change to report, if any."""
        if seen.recovery_action not in (None, "NONE"):
            gpu.pending_action = seen.recovery_action
        existing = gpu.faults.get(seen.ident)
        if existing is None:
            fault = replace(seen)
            gpu.faults[fault.ident] = fault
            log.warning(
                "GPU tainted gpu=%s key=%s value=%s effect=%s class=%s reason=%r",
                gpu.uuid,
                fault.key,
                fault.value,
                fault.effect,
                fault.fault_class.value,
                fault.message,
            )
            return self._change("tainted", gpu, fault)
        quiet_for = seen.last_seen - existing.last_seen
        existing.last_seen = seen.last_seen
        existing.count += 1
        if SEVERITY[seen.fault_class] > SEVERITY[existing.fault_class]:
            # The class decides healing; timeAdded (tolerationSeconds count from it) moves
            # only when the effect grows stronger, and an effect is never lowered.
            existing.fault_class = seen.fault_class
            existing.message, existing.recovery_action = seen.message, seen.recovery_action
            if EFFECT_RANK.get(seen.effect, 0) > EFFECT_RANK.get(existing.effect, 0):
                existing.effect = seen.effect
                existing.time_added = seen.last_seen
                log.warning(
                    "GPU taint escalated gpu=%s key=%s value=%s effect=%s",
                    gpu.uuid,
                    existing.key,
                    existing.value,
                    existing.effect,
                )
                return self._change("escalated", gpu, existing)
        if quiet_for >= self._policy.debounce_seconds:
            log.info(
                "GPU fault repeated gpu=%s key=%s value=%s count=%d",
                gpu.uuid,
                existing.key,
                existing.value,
                existing.count,
            )
            return self._change("repeated", gpu, existing)
        return None

    def _heals(self, gpu: GpuState, fault: Fault, now: float) -> bool:
        if fault.key == KEY_UNMONITORED:
            return False  # lifted by observe_watch_ok only
        if now - fault.last_seen < self._policy.quiet_seconds:
            return False
        if not gpu.answering or gpu.last_probe_ok is None or gpu.last_probe_ok <= fault.last_seen:
            return False
        if fault.fault_class is FaultClass.INFORMATIONAL:
            return True
        if gpu.pending_action is not None:
            return False
        return gpu.cleared_at is not None and gpu.cleared_at > fault.last_seen

    def _heal(self, now: float) -> list[HealthChange]:
        changes = []
        for gpu in self._gpus.values():
            for ident, fault in list(gpu.faults.items()):
                if self._heals(gpu, fault, now):
                    del gpu.faults[ident]
                    log.info(
                        "GPU taint healed gpu=%s key=%s value=%s", gpu.uuid, fault.key, fault.value
                    )
                    changes.append(self._change("healed", gpu, fault))
        return changes

    def _change(self, kind: ChangeKind, gpu: GpuState, fault: Fault) -> HealthChange:
        devices = tuple(
            sorted(n for n, u in self._devices.items() if u == gpu.uuid and fault.covers(n))
        )
        return HealthChange(
            kind, self._node, gpu.uuid, devices, fault.key, fault.value, fault.effect, fault.message
        )

    def _device_health(self, name: str, uuid: str) -> DeviceHealth:
        gpu = self._gpus.get(uuid)
        faults = _device_faults(gpu, name) if gpu else []
        message = "; ".join(f.message for f in faults)
        if len(message) > MAX_MESSAGE:
            message = message[: MAX_MESSAGE - 3] + "..."
        blocking = any(f.effect in ("NoSchedule", "NoExecute") for f in faults)
        if blocking or (gpu is not None and not gpu.answering):
            health = "Unhealthy"
        elif any(f.key == KEY_UNMONITORED for f in faults):
            health = "Unknown"
        else:
            health = "Healthy"
        return DeviceHealth(self._node, name, health, message)

    def _after_change(self, changes: list[HealthChange]) -> None:
        devices = tuple(
            self._device_health(name, uuid) for name, uuid in sorted(self._devices.items())
        )
        snapshot = HealthSnapshot(devices)
        if snapshot != self._snapshot:
            self._snapshot = snapshot
            self._changed.notify_all()
        if changes and self._store is not None:
            self._store.save({u: list(g.faults.values()) for u, g in self._gpus.items()})
        if self._metrics is not None:
            self._publish_metrics()
        for change in changes:
            for listener in self._listeners:
                try:
                    listener(change)
                except Exception:
                    log.exception(
                        "health listener failed kind=%s gpu=%s", change.kind, change.gpu_uuid
                    )

    def _publish_metrics(self) -> None:
        assert self._metrics is not None
        by_health: dict[str, int] = {"Healthy": 0, "Unhealthy": 0, "Unknown": 0}
        for device in self._snapshot.devices:
            by_health[device.health] = by_health.get(device.health, 0) + 1
        taints: dict[tuple[str, str], int] = {}
        for name, uuid in self._devices.items():
            for taint in self.taints_for_gpu(uuid, name):
                ident = (taint["key"], taint["effect"])
                taints[ident] = taints.get(ident, 0) + 1
        self._metrics.state(by_health, taints)

    def _restore(self, saved: Mapping[str, list[Fault]]) -> None:
        for uuid, faults in saved.items():
            gpu = self._gpus.setdefault(uuid, GpuState(uuid))
            for fault in faults:
                gpu.faults[fault.ident] = fault
                if fault.fault_class is FaultClass.LOST:
                    gpu.answering = False  # a passing first probe counts as the GPU coming back
                if fault.recovery_action not in (None, "NONE"):
                    gpu.pending_action = fault.recovery_action
            if faults:
                log.info("restored GPU faults gpu=%s count=%d", uuid, len(faults))
