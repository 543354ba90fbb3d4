"""The health state machine: classification, debouncing, healing, taints, persistence."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from driver.api import HealthSnapshot
from driver.health.metrics import HealthMetrics
from driver.health.monitor import (
    KEY_ECC,
    KEY_GPU_LOST,
    KEY_UNMONITORED,
    KEY_XID,
    HealthChange,
    HealthMonitor,
)
from driver.health.policy import FaultClass, HealthPolicy
from driver.health.store import HealthStateFile
from driver.health.watch import HealthWatcher
from driver.nvml.types import DeviceProbe, XidEvent

GPU_A = "GPU-aaaaaaaa-0000-0000-0000-000000000000"
GPU_B = "GPU-bbbbbbbb-0000-0000-0000-000000000000"
DEVICES = {
    "gpu-aaaaaaaa": GPU_A,
    "gpu-aaaaaaaa-mig-1g10gb-0": GPU_A,
    "gpu-aaaaaaaa-mig-3g40gb-4": GPU_A,
    "gpu-bbbbbbbb": GPU_B,
}
T0 = 1_800_000_000.0


class FakeClock:
    def __init__(self, now: float = T0) -> None:
        self.t = now

    def now(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += seconds


POLICY = HealthPolicy(quiet_seconds=60, debounce_seconds=10, lost_after_probe_failures=2)


def make(
    policy: HealthPolicy = POLICY,
    store: HealthStateFile | None = None,
    metrics: HealthMetrics | None = None,
) -> tuple[HealthMonitor, FakeClock]:
    clock = FakeClock()
    monitor = HealthMonitor(policy, "node-1", clock=clock, store=store, metrics=metrics)
    monitor.set_devices(DEVICES)
    return monitor, clock


def xid(code: int, gpu: str = GPU_A, action: str | None = None) -> XidEvent:
    return XidEvent(gpu, "xid", code, T0, recovery_action=action)


def ok(gpu: str = GPU_A) -> DeviceProbe:
    return DeviceProbe(gpu, healthy=True, lost=False)


def failed(gpu: str = GPU_A, lost: bool = False) -> DeviceProbe:
    return DeviceProbe(gpu, healthy=False, lost=lost, code=15 if lost else 0, detail="boom")


def effects(monitor: HealthMonitor, device: str = "gpu-aaaaaaaa") -> dict[tuple[str, str], str]:
    return {(t["key"], t.get("value", "")): t["effect"] for t in monitor.taints_by_device()[device]}


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        (13, None),
        (31, None),
        (43, None),
        (45, None),
        (68, None),
        (94, None),
        (63, "None"),
        (92, "None"),
        (74, "NoSchedule"),
        (109, "NoSchedule"),
        (119, "NoSchedule"),
        (999, "NoSchedule"),  # an unlisted XID is a device fault
        (48, "NoExecute"),
        (64, "NoExecute"),
        (95, "NoExecute"),
        (79, "NoExecute"),
    ],
)
def test_xid_table_decides_the_taint(code: int, expected: str | None) -> None:
    monitor, _ = make()
    monitor.observe_event(xid(code))
    assert effects(monitor).get((KEY_XID, str(code))) == expected
    assert effects(monitor, "gpu-bbbbbbbb") == {}


@pytest.mark.parametrize(
    ("kind", "key", "value", "expected"),
    [
        ("ecc-double-bit", KEY_ECC, "double-bit", "NoExecute"),
        ("ecc-single-bit", KEY_ECC, "single-bit", "None"),
        ("gpu-lost", KEY_GPU_LOST, "", "NoExecute"),
    ],
)
def test_non_xid_events(kind: str, key: str, value: str, expected: str) -> None:
    monitor, _ = make()
    monitor.observe_event(XidEvent(GPU_A, kind, 0, T0))
    assert effects(monitor) == {(key, value): expected}


@pytest.mark.parametrize(
    ("code", "action", "expected"),
    [
        (13, "GPU_RESET", "NoSchedule"),  # the GPU itself asks for a reset
        (95, "NONE", "NoExecute"),  # NONE may be stale: it never lowers the class
        (13, "NONE", None),
        (154, "GPU_RESET", "NoSchedule"),  # the action changed after an earlier XID
        (74, "NODE_REBOOT", "NoExecute"),
        (109, "nvml_gpu_recovery_action_drain_and_reset", "NoSchedule"),
    ],
)
def test_recovery_action_wins_over_the_table(code: int, action: str, expected: str | None) -> None:
    monitor, _ = make()
    monitor.observe_event(xid(code, action=action))
    assert effects(monitor).get((KEY_XID, str(code))) == expected


def test_effects_and_xid_classes_are_configurable() -> None:
    policy = POLICY.model_copy(
        update={
            "lost_effect": "NoSchedule",
            "xid_classes": {94: FaultClass.RESET, 79: FaultClass.APPLICATION},
        }
    )
    monitor, _ = make(policy)
    monitor.observe_event(xid(94))
    monitor.observe_event(xid(79))
    monitor.observe_event(XidEvent(GPU_A, "gpu-lost", 0, T0))
    assert effects(monitor) == {(KEY_XID, "94"): "NoSchedule", (KEY_GPU_LOST, ""): "NoSchedule"}


def test_taints_expand_to_every_device_of_the_gpu_in_devicetaint_shape() -> None:
    monitor, _ = make()
    monitor.observe_event(xid(79))
    taints = monitor.taints_by_device()
    expected = [
        {
            "key": "gpu.tranche.dev/xid",
            "value": "79",
            "effect": "NoExecute",
            "timeAdded": "2027-01-15T08:00:00Z",
        }
    ]
    assert taints["gpu-aaaaaaaa"] == expected
    assert taints["gpu-aaaaaaaa-mig-1g10gb-0"] == expected
    assert taints["gpu-aaaaaaaa-mig-3g40gb-4"] == expected
    assert taints["gpu-bbbbbbbb"] == []


def test_event_for_an_unknown_gpu_taints_every_gpu() -> None:
    monitor, _ = make()
    monitor.observe_event(XidEvent("", "gpu-lost", 0, T0))
    assert all(monitor.taints_by_device().values())


@pytest.mark.parametrize("event", [XidEvent("", "gpu-lost", 0, T0), xid(79)], ids=["lost", "79"])
def test_a_lost_gpu_from_an_event_heals_when_probes_pass_without_a_recovery_action(
    event: XidEvent,
) -> None:
    """A driver that cannot report the recovery action: a GPU answering probes again after a
    lost event is cleared, as after a lost probe (else NoExecute until the node reboots)."""
    monitor, clock = make()
    monitor.observe_event(event)
    assert list(effects(monitor).values()) == ["NoExecute"]
    clock.advance(61)
    monitor.observe_probe(ok(), recovery_action=None)
    assert effects(monitor) == {}
    assert monitor.snapshot().devices[0].health == "Healthy"


def test_repeats_within_debounce_are_merged() -> None:
    monitor, clock = make()
    seen: list[HealthChange] = []
    monitor.add_listener(seen.append)
    monitor.observe_event(xid(74))
    first = monitor.taints_by_device()
    for _ in range(5):
        clock.advance(1)
        monitor.observe_event(xid(74))
    assert monitor.taints_by_device() == first  # timeAdded unchanged: no republish
    assert [c.kind for c in seen] == ["tainted"]
    clock.advance(30)
    monitor.observe_event(xid(74))
    assert [c.kind for c in seen] == ["tainted", "repeated"]
    assert monitor.faults(GPU_A)[0].count == 7


def test_a_stronger_signal_escalates_the_taint() -> None:
    monitor, clock = make()
    monitor.observe_event(xid(74))
    clock.advance(1)
    monitor.observe_event(xid(74, action="NODE_REBOOT"))
    assert effects(monitor) == {(KEY_XID, "74"): "NoExecute"}


def test_a_stronger_class_with_the_same_effect_keeps_time_added() -> None:
    """``tolerationSeconds`` counts from ``timeAdded``: a stronger class whose effect is
    the same (here reset and uncontained both ``NoExecute``) must not restart that clock."""
    monitor, clock = make(POLICY.model_copy(update={"reset_effect": "NoExecute"}))
    seen: list[HealthChange] = []
    monitor.add_listener(seen.append)
    monitor.observe_event(xid(74, action="GPU_RESET"))
    first = monitor.taints_by_device()
    clock.advance(120)
    monitor.observe_event(xid(74, action="NODE_REBOOT"))
    assert monitor.taints_by_device() == first  # same effect and timeAdded: no republish
    assert [c.kind for c in seen] == ["tainted", "repeated"]
    assert monitor.faults(GPU_A)[0].fault_class is FaultClass.UNCONTAINED  # heals as such


def test_change_names_node_devices_and_reason() -> None:
    monitor, _ = make()
    seen: list[HealthChange] = []
    monitor.add_listener(seen.append)
    monitor.observe_event(xid(79))
    assert seen == [
        HealthChange(
            "tainted",
            "node-1",
            GPU_A,
            ("gpu-aaaaaaaa", "gpu-aaaaaaaa-mig-1g10gb-0", "gpu-aaaaaaaa-mig-3g40gb-4"),
            KEY_XID,
            "79",
            "NoExecute",
            "XID 79 GPU fell off the bus",
        )
    ]


def test_a_failing_listener_does_not_stop_the_monitor() -> None:
    monitor, _ = make()

    def broken(change: HealthChange) -> None:
        raise RuntimeError("event writer down")

    monitor.add_listener(broken)
    monitor.observe_event(xid(79))
    assert effects(monitor) == {(KEY_XID, "79"): "NoExecute"}


def test_informational_taint_heals_after_quiet_time_and_a_probe() -> None:
    monitor, clock = make()
    monitor.observe_event(xid(63))
    monitor.observe_event(xid(63, gpu=GPU_B))
    clock.advance(30)
    monitor.observe_probe(ok(GPU_A))
    assert effects(monitor) == {(KEY_XID, "63"): "None"}  # probed, but not quiet yet
    clock.advance(31)
    monitor.tick()
    assert effects(monitor) == {}
    assert effects(monitor, "gpu-bbbbbbbb") == {(KEY_XID, "63"): "None"}  # quiet, never probed
    monitor.observe_probe(ok(GPU_B))
    assert effects(monitor, "gpu-bbbbbbbb") == {}


def test_reset_fault_needs_a_reset_then_heals() -> None:
    monitor, clock = make()
    monitor.observe_event(xid(95))
    clock.advance(600)
    monitor.observe_probe(ok())
    assert effects(monitor) == {(KEY_XID, "95"): "NoExecute"}  # still no reset
    monitor.observe_event(XidEvent(GPU_A, "recovered", 0, T0))
    clock.advance(1)
    monitor.observe_probe(ok())
    assert effects(monitor) == {}


def test_an_error_after_the_reset_restarts_the_quiet_time() -> None:
    monitor, clock = make()
    monitor.observe_event(xid(74))
    clock.advance(5)
    monitor.observe_event(XidEvent(GPU_A, "recovered", 0, T0))
    clock.advance(5)
    monitor.observe_event(xid(74))  # the fault came back after the reset
    clock.advance(100)
    monitor.observe_probe(ok())
    assert effects(monitor) == {(KEY_XID, "74"): "NoSchedule"}


def test_recovery_action_none_after_the_quiet_time_clears_the_gpu() -> None:
    monitor, clock = make()
    monitor.observe_event(xid(74))
    clock.advance(100)
    monitor.observe_probe(ok())  # this driver reports no recovery action: wait for a reset
    assert effects(monitor) == {(KEY_XID, "74"): "NoSchedule"}
    monitor.observe_probe(ok(), recovery_action="NONE")
    assert effects(monitor) == {}


def test_recovery_action_back_to_none_counts_as_reset() -> None:
    monitor, clock = make()
    monitor.observe_event(xid(119, action="GPU_RESET"))
    clock.advance(100)
    monitor.observe_probe(ok(), recovery_action="GPU_RESET")
    assert effects(monitor) == {(KEY_XID, "119"): "NoSchedule"}
    clock.advance(1)
    monitor.observe_probe(ok(), recovery_action="NONE")
    clock.advance(1)
    monitor.observe_probe(ok(), recovery_action="NONE")
    assert effects(monitor) == {}


def test_gpu_that_stops_answering_is_lost_and_heals_when_it_answers_again() -> None:
    monitor, clock = make()
    monitor.observe_probe(failed())
    assert effects(monitor) == {}  # one failure is debounced
    monitor.observe_probe(failed())
    assert effects(monitor) == {(KEY_GPU_LOST, ""): "NoExecute"}
    assert monitor.snapshot().devices[0].health == "Unhealthy"
    clock.advance(30)
    monitor.observe_probe(ok())  # back, but not yet quiet for 60 s
    assert effects(monitor) == {(KEY_GPU_LOST, ""): "NoExecute"}
    clock.advance(31)
    monitor.observe_probe(ok())
    assert effects(monitor) == {}
    assert monitor.snapshot().devices[0].health == "Healthy"


def test_gpu_is_lost_from_nvml_taints_at_once() -> None:
    monitor, _ = make()
    monitor.observe_probe(failed(lost=True))
    assert effects(monitor) == {(KEY_GPU_LOST, ""): "NoExecute"}


def test_unmonitored_while_events_cannot_be_watched() -> None:
    monitor, clock = make()
    monitor.observe_watch_error("NVML_ERROR_UNKNOWN")
    assert effects(monitor, "gpu-bbbbbbbb") == {(KEY_UNMONITORED, ""): "None"}
    assert {d.health for d in monitor.snapshot().devices} == {"Unknown"}
    clock.advance(1000)
    monitor.observe_probe(ok(GPU_B))
    assert effects(monitor, "gpu-bbbbbbbb") == {(KEY_UNMONITORED, ""): "None"}
    monitor.observe_watch_ok()
    assert effects(monitor, "gpu-bbbbbbbb") == {}


def test_health_source_lists_every_device_with_message() -> None:
    monitor, _ = make()
    before = monitor.snapshot()
    assert [(d.device_name, d.health) for d in before.devices] == [
        ("gpu-aaaaaaaa", "Healthy"),
        ("gpu-aaaaaaaa-mig-1g10gb-0", "Healthy"),
        ("gpu-aaaaaaaa-mig-3g40gb-4", "Healthy"),
        ("gpu-bbbbbbbb", "Healthy"),
    ]
    monitor.observe_event(xid(63, gpu=GPU_B))
    monitor.observe_event(xid(79))
    after = monitor.wait_for_change(before, timeout=0.1)
    states = {d.device_name: (d.pool_name, d.health, d.message) for d in after.devices}
    assert states["gpu-aaaaaaaa-mig-1g10gb-0"] == (
        "node-1",
        "Unhealthy",
        "XID 79 GPU fell off the bus",
    )
    assert states["gpu-bbbbbbbb"] == (
        "node-1",
        "Healthy",
        "XID 63 row remap or page retirement recorded",
    )


def test_wait_for_change_times_out_with_the_same_snapshot() -> None:
    monitor, _ = make()
    snap = monitor.snapshot()
    assert monitor.wait_for_change(snap, timeout=0.01) == snap
    assert monitor.wait_for_change(HealthSnapshot(), timeout=0.01) == snap


def test_taints_survive_a_restart_only_while_the_fault_holds(tmp_path: Path) -> None:
    state = tmp_path / "health.json"
    monitor, clock = make(store=HealthStateFile(state, boot_id="boot-1"))
    monitor.observe_event(xid(95))
    monitor.observe_probe(failed(GPU_B, lost=True))
    before = monitor.taints_by_device()

    restarted = HealthMonitor(
        POLICY, "node-1", clock=clock, store=HealthStateFile(state, boot_id="boot-1")
    )
    restarted.set_devices(DEVICES)
    assert restarted.taints_by_device() == before
    clock.advance(120)
    restarted.observe_probe(ok(GPU_A))
    restarted.observe_probe(ok(GPU_B))  # GPU B answers again: reset by whoever brought it back
    after = restarted.taints_by_device()
    assert after["gpu-aaaaaaaa"] == before["gpu-aaaaaaaa"]  # XID 95 still needs a reset
    assert after["gpu-bbbbbbbb"] == []


def test_a_restored_unmonitored_taint_is_lifted_once_this_process_registers(
    tmp_path: Path,
) -> None:
    state = tmp_path / "health.json"
    monitor, clock = make(store=HealthStateFile(state, boot_id="boot-1"))
    monitor.observe_watch_error("nvmlEventSetWait: unknown error")
    restarted = HealthMonitor(
        POLICY, "node-1", clock=clock, store=HealthStateFile(state, boot_id="boot-1")
    )
    restarted.set_devices(DEVICES)
    assert effects(restarted) == {(KEY_UNMONITORED, ""): "None"}
    watcher = HealthWatcher(restarted, lambda t: None, ok, register_events=lambda: [GPU_B])
    watcher.register()
    assert effects(restarted) == {}
    assert effects(restarted, "gpu-bbbbbbbb") == {(KEY_UNMONITORED, ""): "None"}  # not registered


def test_faults_from_another_boot_are_not_restored(tmp_path: Path) -> None:
    state = tmp_path / "health.json"
    monitor, clock = make(store=HealthStateFile(state, boot_id="boot-1"))
    monitor.observe_event(xid(95))
    rebooted = HealthMonitor(
        POLICY, "node-1", clock=clock, store=HealthStateFile(state, boot_id="boot-2")
    )
    rebooted.set_devices(DEVICES)
    assert all(t == [] for t in rebooted.taints_by_device().values())


@pytest.mark.parametrize("damage", ["not json", "not utf-8", "checksum", "version"])
def test_corrupt_state_file_is_reported_and_ignored(
    tmp_path: Path, damage: str, caplog: pytest.LogCaptureFixture
) -> None:
    state = tmp_path / "health.json"
    monitor, _ = make(store=HealthStateFile(state, boot_id="b"))
    monitor.observe_event(xid(95))
    if damage == "not json":
        state.write_text("{")
    elif damage == "not utf-8":  # a torn write can leave any bytes
        state.write_bytes(state.read_bytes().replace(b'"bootId"', b'"boot\xffId"'))
    else:
        doc = json.loads(state.read_text())
        if damage == "checksum":
            doc["gpus"][GPU_A][0]["effect"] = "None"
        else:
            doc["version"] = 99
        state.write_text(json.dumps(doc))
    assert HealthStateFile(state, boot_id="b").load() == {}
    assert str(state) in caplog.text
    restarted, _ = make(store=HealthStateFile(state, boot_id="b"))  # the plugin still starts
    assert all(t == [] for t in restarted.taints_by_device().values())


def test_metrics_follow_the_state() -> None:
    registry = CollectorRegistry()
    monitor, _ = make(metrics=HealthMetrics(registry))
    monitor.observe_event(xid(79))
    monitor.observe_event(xid(13))

    def value(name: str, **labels: str) -> float | None:
        return registry.get_sample_value(name, labels)

    assert value("tranche_devices_by_health", health="Unhealthy") == 3
    assert value("tranche_devices_by_health", health="Healthy") == 1
    assert value("tranche_device_health_taints", key=KEY_XID, effect="NoExecute") == 3
    assert value("tranche_gpu_faults_total", kind="xid", xid="79", fault_class="lost") == 1
    assert value("tranche_gpu_faults_total", kind="xid", xid="13", fault_class="application") == 1


def test_gpus_that_disappear_are_forgotten() -> None:
    monitor, _ = make()
    monitor.observe_event(xid(79, gpu=GPU_B))
    monitor.set_devices({k: v for k, v in DEVICES.items() if v == GPU_A})
    assert monitor.gpus() == [GPU_A]
    assert "gpu-bbbbbbbb" not in monitor.taints_by_device()


def test_a_fault_of_one_mig_instance_stays_on_its_device_heals_and_survives_a_restart(
    tmp_path: Path,
) -> None:
    state = tmp_path / "health.json"
    slots = {
        (GPU_A, 19, 0): "gpu-aaaaaaaa-mig-1g10gb-0",
        (GPU_A, 9, 4): "gpu-aaaaaaaa-mig-3g40gb-4",
    }
    monitor, clock = make(store=HealthStateFile(state, boot_id="boot-1"))
    monitor.set_devices(DEVICES, slots)
    changes: list[HealthChange] = []
    monitor.add_listener(changes.append)
    monitor.observe_event(XidEvent(GPU_A, "xid", 63, T0, gi_id=2, ci_id=0, mig_slot=(9, 4)))
    tainted = {d for d, t in monitor.taints_by_device().items() if t}
    assert tainted == {"gpu-aaaaaaaa-mig-3g40gb-4"}
    assert changes[-1].devices == ("gpu-aaaaaaaa-mig-3g40gb-4",)
    health = {d.device_name: d.health for d in monitor.snapshot().devices}
    assert "XID 63" in next(
        d.message
        for d in monitor.snapshot().devices
        if d.device_name == "gpu-aaaaaaaa-mig-3g40gb-4"
    )
    assert set(health.values()) == {"Healthy"}  # effect None

    restarted = HealthMonitor(
        POLICY, "node-1", clock=clock, store=HealthStateFile(state, boot_id="boot-1")
    )
    restarted.set_devices(DEVICES, slots)
    assert restarted.taints_by_device() == monitor.taints_by_device()
    clock.advance(120)
    restarted.observe_probe(ok())
    assert {d for d, t in restarted.taints_by_device().items() if t} == set()
