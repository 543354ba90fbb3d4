"""The plugin sweeps when a GPU heals: a MIG device that an unprepare could not destroy while
its GPU was lost is destroyed once the GPU answers again and its health taint heals, without
waiting for the plugin's next start."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

from driver.devices.inventory import DYNAMIC_MIG
from driver.health.policy import HealthPolicy
from driver.nvml.sim import SimControl, SimStore, open_simulated
from driver.nvml.sim.control import find_gpu
from kubelet_plugin.heal_sweep import SweepOnHeal
from tests.unit.claim_values import claim, ref_of, result
from tests.unit.kubelet_plugin.sim_plugin import sim_plugin
from tests.unit.kubelet_plugin.slice_api import SliceApi
from tests.waiting import wait_for


def test_a_mig_device_left_on_a_lost_gpu_is_destroyed_when_the_gpu_heals(tmp_path: Path) -> None:
    api = SliceApi()
    api.close()  # nothing here needs the API server: Events and slices fail in the background
    plugin = sim_plugin(
        tmp_path, api, advertise=DYNAMIC_MIG, health_policy=HealthPolicy(quiet_seconds=0)
    )
    plugin.desired_slices()  # the health monitor learns the devices
    gpu = plugin.inventory.gpus[0]
    mig = plugin.inventory.migs_of(gpu.name)[2]
    nvml = open_simulated(tmp_path / "sim.json")
    store = SimStore(path=tmp_path / "sim.json")
    obj = claim("m1", [result(mig.name, request="mig")], name="c-m1")
    assert plugin.state.prepare(obj, ref_of(obj)).error == ""

    SimControl(store).lose_gpu(gpu.uuid)
    plugin.health.observe_probe(nvml.probe(gpu.uuid))
    assert plugin.health.faults(gpu.uuid), "the lost GPU is tainted"
    assert plugin.state.unprepare(ref_of(obj)).error == ""  # the pod could end

    def back(state: Any) -> None:  # the GPU answers again without a reset
        find_gpu(state, gpu.uuid).lost = False

    store.update(back)
    assert len(nvml.mig_instances(gpu.uuid)) == 1, "left by the unprepare"
    time.sleep(0.01)  # the passing probe comes after the fault
    plugin.health.observe_probe(nvml.probe(gpu.uuid))
    assert not plugin.health.faults(gpu.uuid), "healed"
    wait_for("the MIG device swept", lambda: nvml.mig_instances(gpu.uuid) == (), 10)
    assert not nvml.mig_enabled(gpu.uuid)


def test_heals_during_a_sweep_make_one_more_sweep_not_one_each() -> None:
    runs: list[int] = []
    gate = threading.Event()

    def sweep() -> None:
        runs.append(1)
        gate.wait(5)

    listener = SweepOnHeal(sweep)
    listener.request()
    wait_for("the first sweep started", lambda: runs, 5)
    for _ in range(3):
        listener.request()
    gate.set()
    assert listener.wait_idle(5)
    assert len(runs) == 2
