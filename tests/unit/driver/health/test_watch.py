"""The NVML-facing health loop and the health flags."""

from __future__ import annotations

import queue
import threading

import pytest
from pydantic import ValidationError

from driver.errors import NvmlError
from driver.health.monitor import (
    KEY_GPU_LOST,
    KEY_UNMONITORED,
    KEY_XID,
    HealthChange,
    HealthMonitor,
)
from driver.health.policy import FaultClass, HealthPolicy
from driver.health.watch import HealthWatcher
from driver.nvml.types import DeviceProbe, XidEvent

GPU = "GPU-aaaaaaaa-0000-0000-0000-000000000000"


class FakeNvml:
    """Events from a queue; probes answer, fail or hang as the test says."""

    def __init__(self) -> None:
        self.events: queue.Queue[XidEvent | NvmlError] = queue.Queue()
        self.mode = "ok"
        self.release = threading.Event()

    def wait_event(self, timeout: float) -> XidEvent | None:
        try:
            item = self.events.get(timeout=timeout)
        except queue.Empty:
            return None
        if isinstance(item, NvmlError):
            raise item
        return item

    def probe(self, uuid: str) -> DeviceProbe:
        if self.mode == "lost":
            raise NvmlError(f"nvmlDeviceGetTemperature({uuid}): GPU is lost", 15)
        if self.mode == "hang":
            self.release.wait(10)
        return DeviceProbe(uuid, healthy=True, lost=False)


def setup(**policy: float) -> tuple[HealthMonitor, FakeNvml, HealthWatcher]:
    settings = HealthPolicy(event_wait_seconds=0.01, lost_after_probe_failures=1, **policy)
    monitor = HealthMonitor(settings, "node-1")
    monitor.set_devices({"gpu-aaaaaaaa": GPU})
    nvml = FakeNvml()
    return monitor, nvml, HealthWatcher(monitor, nvml.wait_event, nvml.probe)


def keys(monitor: HealthMonitor) -> set[str]:
    return {t["key"] for t in monitor.taints_by_device()["gpu-aaaaaaaa"]}


def test_event_from_nvml_reaches_the_taints_through_the_thread() -> None:
    monitor, nvml, watcher = setup()
    before = monitor.snapshot()
    watcher.start()
    try:
        nvml.events.put(XidEvent(GPU, "xid", 79, 0.0))
        after = monitor.wait_for_change(before, timeout=10)
    finally:
        watcher.stop()
    assert after.devices[0].health == "Unhealthy"
    assert keys(monitor) == {KEY_XID}


def test_gpu_is_lost_from_the_probe() -> None:
    monitor, nvml, watcher = setup()
    nvml.mode = "lost"
    watcher.probe_all()
    assert keys(monitor) == {KEY_GPU_LOST}
    assert "GPU is lost" in monitor.snapshot().devices[0].message


def test_a_hanging_probe_counts_as_lost_and_keeps_failing_while_stuck() -> None:
    monitor, nvml, watcher = setup(probe_timeout_seconds=0.05)
    nvml.mode = "hang"
    try:
        watcher.probe_all()
        assert keys(monitor) == {KEY_GPU_LOST}
        assert "timed out after 0.05s" in monitor.snapshot().devices[0].message
        watcher.probe_all()  # the first call is still stuck: no second call piles up
        assert monitor.faults(GPU)[0].count == 2
    finally:
        nvml.release.set()


def test_event_wait_errors_mark_gpus_unmonitored_until_it_works() -> None:
    monitor, nvml, watcher = setup()
    nvml.events.put(NvmlError("nvmlEventSetWait: unknown error", 999))
    watcher.poll_event()
    assert keys(monitor) == {KEY_UNMONITORED}
    assert monitor.snapshot().devices[0].health == "Unknown"
    watcher.poll_event()
    assert keys(monitor) == set()


def test_a_failed_event_registration_is_retried_until_it_works() -> None:
    """``unmonitored`` lasts until watching works again, also when registering failed."""
    monitor = HealthMonitor(
        HealthPolicy(event_wait_seconds=0.01, probe_interval_seconds=0.02), "node-1"
    )
    monitor.set_devices({"gpu-aaaaaaaa": GPU})
    nvml = FakeNvml()
    attempts: list[int] = []

    def register() -> list[str]:
        attempts.append(1)
        if len(attempts) == 1:
            raise NvmlError("nvmlEventSetCreate: unknown error", 999)
        return []

    def wait_event(timeout: float) -> XidEvent | None:
        if len(attempts) < 2:
            raise NvmlError("wait_event before register_events", 1)
        return nvml.wait_event(timeout)

    watcher = HealthWatcher(monitor, wait_event, nvml.probe, register_events=register)
    changes: list[HealthChange] = []
    monitor.add_listener(changes.append)
    watcher.start()
    try:
        snap = monitor.snapshot()
        for _ in range(100):
            if keys(monitor) == set():
                break
            snap = monitor.wait_for_change(snap, 0.1)
    finally:
        watcher.stop()
    assert [(c.kind, c.key) for c in changes[:2]] == [
        ("tainted", KEY_UNMONITORED),
        ("healed", KEY_UNMONITORED),
    ]
    assert keys(monitor) == set()
    assert monitor.snapshot().devices[0].health == "Healthy"


def test_gpu_is_lost_from_the_event_wait_affects_every_gpu() -> None:
    monitor, nvml, watcher = setup()
    nvml.events.put(NvmlError("nvmlEventSetWait: GPU is lost", 15))
    watcher.poll_event()
    assert keys(monitor) == {KEY_GPU_LOST}


def test_policy_from_json_as_the_plugin_flag_gives_it() -> None:
    policy = HealthPolicy.model_validate(
        {"lost_effect": "NoSchedule", "xid_classes": {"94": "reset", "109": "application"}}
    )
    assert policy.lost_effect == "NoSchedule"
    assert policy.xid_classes == {94: FaultClass.RESET, 109: FaultClass.APPLICATION}


@pytest.mark.parametrize(
    ("doc", "field"),
    [
        ({"xid_classes": {"94": "fatal"}}, "xid_classes.94"),
        ({"xid_classes": {"0": "reset"}}, "xid_classes"),
        ({"quiet_seconds": -1}, "quiet_seconds"),
        ({"reset_effect": "PreferNoSchedule"}, "reset_effect"),
        ({"quiet": 5}, "quiet"),
    ],
)
def test_bad_policy_names_the_field(doc: dict[str, object], field: str) -> None:
    with pytest.raises(ValidationError) as err:
        HealthPolicy.model_validate(doc)
    assert field in str(err.value)
