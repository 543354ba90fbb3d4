"""The NVML-facing health loop and the health flags."""

from __future__ import annotations

import argparse
import queue
import threading

import pytest

from driver.errors import ConfigError, NvmlError
from driver.health import KEY_GPU_LOST, KEY_UNMONITORED, KEY_XID, HealthMonitor
from driver.health_policy import FaultClass, add_health_arguments, policy_from_args
from driver.health_watch import HealthWatcher
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
    args = argparse.ArgumentParser()
    add_health_arguments(args, env={})
    settings = policy_from_args(args.parse_args([]))
    settings = settings.model_copy(
        update={"event_wait_seconds": 0.01, "lost_after_probe_failures": 1, **policy}
    )
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


def test_gpu_is_lost_from_the_event_wait_affects_every_gpu() -> None:
    monitor, nvml, watcher = setup()
    nvml.events.put(NvmlError("nvmlEventSetWait: GPU is lost", 15))
    watcher.poll_event()
    assert keys(monitor) == {KEY_GPU_LOST}


def test_flags_have_env_twins() -> None:
    parser = argparse.ArgumentParser()
    add_health_arguments(
        parser,
        env={
            "TRANCHE_HEALTH_LOST_EFFECT": "NoSchedule",
            "TRANCHE_HEALTH_XID_CLASSES": "94=reset, 109=application",
            "TRANCHE_HEALTH_QUIET_SECONDS": "30",
        },
    )
    policy = policy_from_args(parser.parse_args(["--health-quiet-seconds", "45"]))
    assert policy.lost_effect == "NoSchedule"
    assert policy.xid_classes == {94: FaultClass.RESET, 109: FaultClass.APPLICATION}
    assert policy.quiet_seconds == 45


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--health-xid-classes", "94"], "'94' is not XID=CLASS"),
        (["--health-xid-classes", "94=fatal"], "class 'fatal' for XID 94"),
        (["--health-quiet-seconds", "-1"], "--health-quiet-seconds"),
        (["--health-probe-timeout-seconds", "soon"], "--health-probe-timeout-seconds"),
    ],
)
def test_bad_flags_name_the_flag(argv: list[str], message: str) -> None:
    parser = argparse.ArgumentParser()
    add_health_arguments(parser, env={})
    with pytest.raises(ConfigError, match=message):
        policy_from_args(parser.parse_args(argv))
