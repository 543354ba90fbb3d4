"""Health end to end on one node: simulated NVML -> facade -> watcher -> taints per device."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from driver.api import HealthSnapshot
from driver.devices.inventory import DYNAMIC_MIG, AdvertiseConfig, build_inventory
from driver.health.monitor import KEY_GPU_LOST, KEY_XID, HealthMonitor, device_gpu_map
from driver.health.policy import HealthPolicy
from driver.health.watch import HealthWatcher
from driver.nvml.facade import Nvml
from driver.nvml.sim import SimControl, SimStore, create_state, open_simulated
from tests.unit.kubelet_plugin.sim_plugin import sim_plugin
from tests.unit.kubelet_plugin.slice_api import SliceApi

POLICY = HealthPolicy(
    quiet_seconds=0.3,
    debounce_seconds=0,
    probe_interval_seconds=0.05,
    probe_timeout_seconds=2,
    event_wait_seconds=0.05,
)


@pytest.fixture
def store() -> SimStore:
    return create_state("dgx-h100")


@pytest.fixture
def nvml(store: SimStore) -> Iterator[Nvml]:
    n = open_simulated(store)
    yield n
    n.shutdown()


@pytest.fixture
def devices(nvml: Nvml) -> dict[str, str]:
    """Device name -> GPU UUID for every device the node advertises (GPUs and MIG slots)."""
    return device_gpu_map(build_inventory(nvml.list_gpus(), nvml.system_info(), DYNAMIC_MIG))


@pytest.fixture
def monitor(nvml: Nvml, devices: dict[str, str]) -> Iterator[HealthMonitor]:
    mon = HealthMonitor(POLICY, "node-1")
    mon.set_devices(devices)
    watcher = HealthWatcher.from_facade(mon, nvml)
    watcher.start()
    yield mon
    watcher.stop()


def wait_until(
    monitor: HealthMonitor, check: Callable[[HealthMonitor], bool], timeout: float = 10
) -> HealthSnapshot:
    """Wait for snapshots until ``check(monitor)`` holds; fail after ``timeout``."""
    snap = monitor.snapshot()
    for _ in range(200):
        if check(monitor):
            return snap
        snap = monitor.wait_for_change(snap, timeout / 200)
    raise AssertionError(f"condition not reached; taints: {monitor.taints_by_device()}")


def keys_on(monitor: HealthMonitor, device: str) -> set[str]:
    return {t["key"] for t in monitor.taints_by_device()[device]}


def test_lost_gpu_taints_its_gpu_and_mig_devices_then_heals_after_recovery(
    monitor: HealthMonitor, nvml: Nvml, store: SimStore, devices: dict[str, str]
) -> None:
    victim = nvml.list_gpus()[2].uuid
    on_victim = [name for name, uuid in devices.items() if uuid == victim]
    others = [name for name, uuid in devices.items() if uuid != victim]
    assert any("-mig-" in name for name in on_victim)

    SimControl(store).lose_gpu(victim)
    lost = {KEY_XID, KEY_GPU_LOST}
    wait_until(monitor, lambda m: all(keys_on(m, d) == lost for d in on_victim))
    assert all(keys_on(monitor, d) == set() for d in others)
    health = {d.device_name: d.health for d in monitor.snapshot().devices}
    assert {health[d] for d in on_victim} == {"Unhealthy"}

    SimControl(store).recover(victim)
    wait_until(monitor, lambda m: all(keys_on(m, d) == set() for d in on_victim))
    assert {d.health for d in monitor.snapshot().devices} == {"Healthy"}


def test_uncontained_error_heals_once_nvml_no_longer_asks_for_a_reset(
    monitor: HealthMonitor, nvml: Nvml, store: SimStore, devices: dict[str, str]
) -> None:
    gpu = nvml.list_gpus()[0].uuid
    name = next(n for n, u in devices.items() if u == gpu and "-mig-" not in n)
    SimControl(store).inject_xid(gpu, 95, recovery_action="gpu-reset")
    wait_until(monitor, lambda m: keys_on(m, name) == {KEY_XID})
    taint = monitor.taints_by_device()[name][0]
    assert (taint["value"], taint["effect"]) == ("95", "NoExecute")
    monitor.wait_for_change(monitor.snapshot(), POLICY.quiet_seconds * 3)
    assert keys_on(monitor, name) == {KEY_XID}  # quiet, but the reset is still pending

    SimControl(store).recover(gpu)
    wait_until(monitor, lambda m: keys_on(m, name) == set())


def test_a_fault_of_a_gpu_the_node_hides_taints_no_other_gpu(tmp_path: Path) -> None:
    """A GPU hidden with ``--advertise`` (an empty list) publishes no device and has no
    health: its XID must not count as an event of an unknown GPU, which taints every GPU."""
    hidden = create_state("dgx-h100").read(lambda s: s.gpus[7].uuid)
    api = SliceApi()
    try:
        plugin = sim_plugin(tmp_path, api, advertise=AdvertiseConfig({hidden: ()}))
        assert hidden not in plugin.health.gpus()
        plugin.watcher.register()
        SimControl(SimStore(path=tmp_path / "sim.json")).inject_xid(hidden, 79)
        for _ in range(3):
            plugin.watcher.poll_event()
        assert {k: v for k, v in plugin.health.taints_by_device().items() if v} == {}
        assert {d.health for d in plugin.health.snapshot().devices} == {"Healthy"}
    finally:
        api.close()


@pytest.mark.parametrize(
    ("xid", "on", "only_instance"),
    [
        (63, "mig", True),  # informational, reported for one MIG instance: its device alone
        (48, "mig", False),  # uncontained: the GPU needs a reset, whatever instance it names
        (63, "gpu", False),  # GI/CI 0xFFFFFFFF: the whole GPU
        (63, "unknown-gi", False),  # an instance the plugin does not know: fail safe
    ],
)
def test_an_xid_of_one_mig_instance_taints_only_its_device_unless_the_gpu_is_at_fault(
    tmp_path: Path, xid: int, on: str, only_instance: bool
) -> None:
    api = SliceApi()
    nvml = None
    try:
        plugin = sim_plugin(tmp_path, api, advertise=DYNAMIC_MIG)
        nvml = open_simulated(tmp_path / "sim.json")
        gpu = nvml.list_gpus()[0].uuid
        nvml.set_mig_mode(gpu, True)
        faulty = nvml.create_mig_instance(gpu, 19, 0)  # as a dynamic MIG prepare does
        nvml.create_mig_instance(gpu, 19, 1)
        on_gpu = {d for d, u in device_gpu_map(plugin.inventory).items() if u == gpu}
        device = next(
            m.name
            for m in plugin.inventory.migs
            if (m.parent.uuid, m.profile.id, m.start) == (gpu, 19, 0)
        )
        plugin.watcher.register()
        gi = 9 if on == "unknown-gi" else None
        SimControl(SimStore(path=tmp_path / "sim.json")).inject_xid(
            faulty.uuid if on == "mig" else gpu, xid, gi_id=gi, ci_id=None if gi is None else 0
        )
        for _ in range(3):
            plugin.watcher.poll_event()

        tainted = {d for d, t in plugin.health.taints_by_device().items() if t}
        assert tainted == ({device} if only_instance else on_gpu)
        published = {
            d["name"]
            for s in plugin.desired_slices()
            for d in s["spec"].get("devices", [])
            if d.get("taints")
        }
        assert published == tainted
    finally:
        if nvml is not None:
            nvml.shutdown()
        api.close()
