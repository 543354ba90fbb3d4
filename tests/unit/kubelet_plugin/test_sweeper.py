"""The plugin sweeps what an unprepare on a lost GPU left there: a MIG device that could not be
destroyed while its GPU was lost is destroyed once the GPU answers again, without waiting for
the plugin's next start, whether or not a health taint marked the loss, and again after a
sweep that failed."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

from driver.devices.inventory import DYNAMIC_MIG
from driver.health.monitor import HealthChange
from driver.health.policy import HealthPolicy
from driver.nvml.sim import SimControl, SimStore, open_simulated
from driver.nvml.sim.control import find_gpu
from driver.prepare.node_lock import NodeLock
from kubelet_plugin.node import NodePlugin
from kubelet_plugin.sweeper import Sweeper
from tests.unit.claim_values import claim, ref_of, result
from tests.unit.kubelet_plugin.sim_plugin import sim_plugin
from tests.unit.kubelet_plugin.slice_api import SliceApi
from tests.waiting import wait_for


def mig_plugin(tmp_path: Path, policy: HealthPolicy, sweep_interval_s: float = 60.0) -> NodePlugin:
    api = SliceApi()
    api.close()  # nothing here needs the API server: Events and slices fail in the background
    plugin = sim_plugin(
        tmp_path,
        api,
        advertise=DYNAMIC_MIG,
        health_policy=policy,
        sweep_interval_s=sweep_interval_s,
    )
    plugin.desired_slices()  # the health monitor learns the devices
    return plugin


def leave_mig_device_on_lost_gpu(tmp_path: Path, plugin: NodePlugin) -> str:
    """Prepare a dynamic MIG claim, lose its GPU (the monitor's probe sees it), unprepare the
    claim (its pod could end): the MIG device stays. Returns the GPU's UUID."""
    gpu = plugin.inventory.gpus[0]
    mig = plugin.inventory.migs_of(gpu.name)[2]
    nvml = open_simulated(tmp_path / "sim.json")
    obj = claim("m1", [result(mig.name, request="mig")], name="c-m1")
    assert plugin.state.prepare(obj, ref_of(obj)).error == ""
    SimControl(SimStore(path=tmp_path / "sim.json")).lose_gpu(gpu.uuid)
    plugin.health.observe_probe(nvml.probe(gpu.uuid))
    assert plugin.state.unprepare(ref_of(obj)).error == ""
    return gpu.uuid


def answers_again(tmp_path: Path, gpu_uuid: str) -> None:
    """The GPU answers again without a reset: its MIG devices stay."""

    def back(state: Any) -> None:
        find_gpu(state, gpu_uuid).lost = False

    SimStore(path=tmp_path / "sim.json").update(back)


def test_a_mig_device_left_on_a_lost_gpu_is_destroyed_when_the_gpu_heals(tmp_path: Path) -> None:
    plugin = mig_plugin(tmp_path, HealthPolicy(quiet_seconds=0))
    gpu = leave_mig_device_on_lost_gpu(tmp_path, plugin)
    assert plugin.health.faults(gpu), "the lost GPU is tainted"
    nvml = open_simulated(tmp_path / "sim.json")
    answers_again(tmp_path, gpu)
    assert len(nvml.mig_instances(gpu)) == 1, "left by the unprepare"
    time.sleep(0.01)  # the passing probe comes after the fault
    plugin.health.observe_probe(nvml.probe(gpu))
    assert not plugin.health.faults(gpu), "healed"
    wait_for("the MIG device swept", lambda: nvml.mig_instances(gpu) == (), 10)
    assert not nvml.mig_enabled(gpu)
    plugin.sweeper.stop(5)


def test_a_mig_device_left_on_a_gpu_whose_loss_taints_nothing_is_destroyed_once_it_answers(
    tmp_path: Path,
) -> None:
    """With the lost effect ``Ignore`` no taint marks the loss, so none heals: the periodic
    look finds the leftover and sweeps once the GPU answers, with no restart."""
    plugin = mig_plugin(tmp_path, HealthPolicy(lost_effect="Ignore"), sweep_interval_s=0.05)
    plugin.sweeper.start()  # as the plugin's start does
    try:
        gpu = leave_mig_device_on_lost_gpu(tmp_path, plugin)
        assert plugin.health.faults(gpu) == [], "no taint for a lost GPU"
        assert plugin.state.left_over(), "the unprepare left the MIG device"
        time.sleep(0.3)  # looks while the GPU is still lost change nothing
        nvml = open_simulated(tmp_path / "sim.json")
        answers_again(tmp_path, gpu)
        wait_for("the MIG device swept", lambda: nvml.mig_instances(gpu) == (), 10)
        assert not nvml.mig_enabled(gpu)
        wait_for("nothing left", lambda: plugin.state.left_over() == (), 5)
    finally:
        plugin.sweeper.stop(5)


def test_a_sweep_that_failed_is_tried_again_without_another_heal(tmp_path: Path) -> None:
    """The heal's sweep times out on the node lock (a long prepare holds it): the next look
    sweeps."""
    plugin = mig_plugin(tmp_path, HealthPolicy(quiet_seconds=0), sweep_interval_s=0.2)
    plugin.state.node_lock.timeout_s = 0.1
    gpu = leave_mig_device_on_lost_gpu(tmp_path, plugin)
    nvml = open_simulated(tmp_path / "sim.json")
    answers_again(tmp_path, gpu)
    try:
        with NodeLock(plugin.state.lock_path, 5).held():  # another process's prepare, say
            time.sleep(0.01)
            plugin.health.observe_probe(nvml.probe(gpu))
            assert not plugin.health.faults(gpu), "healed"
            time.sleep(0.3)  # the heal's sweep fails meanwhile
            assert len(nvml.mig_instances(gpu)) == 1
        wait_for("the MIG device swept", lambda: nvml.mig_instances(gpu) == (), 10)
    finally:
        plugin.sweeper.stop(5)


def healed(key: str = "gpu.tranche.dev/unmonitored") -> HealthChange:
    return HealthChange("healed", "node-a", "GPU-1", ("gpu-0",), key, "", "None", "")


def test_a_heal_with_nothing_left_over_does_not_sweep() -> None:
    """An informational taint heals: the sweep (node lock, NVML calls) runs only when the
    journals name something left over."""
    sweeps: list[int] = []
    left: list[str] = []
    sweeper = Sweeper(lambda: sweeps.append(1), lambda: tuple(left), interval_s=60)
    try:
        sweeper(healed())
        assert sweeper.wait_idle(5)
        assert sweeps == []
        left.append("MIG device gpu-0-mig-1g.10gb-0 (GPU-1/0) of claim m1")
        sweeper(healed())
        assert sweeper.wait_idle(5)
        assert sweeps == [1]
    finally:
        sweeper.stop(5)


def test_heals_during_a_sweep_make_one_more_sweep_not_one_each() -> None:
    runs: list[int] = []
    gate = threading.Event()

    def sweep() -> None:
        runs.append(1)
        gate.wait(5)

    sweeper = Sweeper(sweep, lambda: ("left",), interval_s=60)
    try:
        sweeper.request()
        wait_for("the first sweep started", lambda: runs, 5)
        for _ in range(3):
            sweeper.request()
        gate.set()
        assert sweeper.wait_idle(5)
        assert len(runs) == 2
    finally:
        sweeper.stop(5)


def test_stop_ends_the_looks_at_once_and_none_starts_after_it() -> None:
    looks: list[int] = []

    def left_over() -> tuple[str, ...]:
        looks.append(1)
        return ()

    sweeper = Sweeper(lambda: None, left_over, interval_s=60)
    sweeper.start()
    sweeper.request()
    assert sweeper.wait_idle(5)
    started = time.monotonic()
    sweeper.stop(5)
    assert time.monotonic() - started < 1, "the stop waited for the next look"
    sweeper.request()
    time.sleep(0.1)
    assert looks == [1]


def test_sweeps_that_clean_nothing_back_off_and_a_heal_resets_the_wait() -> None:
    """A GPU that stays lost: every sweep leaves the leftover (and the MIG handler logs an
    error). The looks back off instead of sweeping every interval; a heal sweeps at once."""
    sweeps: list[float] = []
    sweeper = Sweeper(lambda: sweeps.append(time.monotonic()), lambda: ("left",), 0.05)
    sweeper.start()
    try:
        time.sleep(1.6)
        # every 0.05 s would be ~32 sweeps; backing off (0.05, 0.1, 0.2, 0.4, 0.8) about 5
        assert 1 <= len(sweeps) <= 7, sweeps
        before = len(sweeps)
        sweeper.request()  # a heal
        wait_for("the heal's sweep", lambda: len(sweeps) > before, 0.5)
    finally:
        sweeper.stop(5)


def test_a_sweep_that_cleans_something_keeps_the_interval() -> None:
    left = ["a", "b", "c", "d", "e", "f", "g", "h"]
    sweeps: list[int] = []

    def sweep() -> None:
        sweeps.append(1)
        if left:
            left.pop()

    sweeper = Sweeper(sweep, lambda: tuple(left), 0.05)
    sweeper.start()
    try:
        wait_for("every leftover swept", lambda: not left, 1.0)
    finally:
        sweeper.stop(5)
