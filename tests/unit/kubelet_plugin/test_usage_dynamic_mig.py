"""The plugin's usage metrics for a dynamic MIG device: its unprepare destroys it, and the
time its claim held it in the last interval is still measured, never unmeasured (which the
report charges as used)."""

from __future__ import annotations

from pathlib import Path

from prometheus_client import CollectorRegistry

from driver.devices.inventory import DYNAMIC_MIG
from tests.unit.claim_values import claim, ref_of, result
from tests.unit.kubelet_plugin.sim_plugin import sim_plugin
from tests.unit.kubelet_plugin.slice_api import SliceApi


def test_a_dynamic_mig_claim_unprepared_mid_interval_is_measured_not_unmeasured(
    tmp_path: Path,
) -> None:
    registry = CollectorRegistry()
    api = SliceApi()
    try:
        plugin = sim_plugin(tmp_path, api, advertise=DYNAMIC_MIG, registry=registry)
    finally:
        api.close()
    gpu = plugin.inventory.gpus[0]
    slot = next(m for m in plugin.inventory.migs_of(gpu.name) if m.profile.name == "3g.40gb")
    obj = claim("m1", [result(slot.name, request="mig")], name="train", namespace="ml")
    assert plugin.state.prepare(obj, ref_of(obj)).error == ""
    state, _ = plugin.checkpoint.load()
    uuid = state.claims["m1"].device_uuids[slot.name]
    assert plugin.sampler.sample_once() is None  # the starting point

    assert plugin.state.unprepare(ref_of(obj)).error == ""  # destroys the MIG device
    assert not plugin.nvml.mig_instances(gpu.uuid)
    interval = plugin.sampler.sample_once()
    assert interval is not None

    labels = {"namespace": "ml", "claim": "train", "tenant": "ml"}
    allocated = registry.get_sample_value("tranche_claim_gpu_allocated_seconds_total", labels)
    unmeasured = registry.get_sample_value("tranche_claim_gpu_unmeasured_seconds_total", labels)
    assert allocated is not None and allocated > 0
    assert unmeasured == 0.0, (
        f"{unmeasured} of {allocated} GPU-s held until the unprepare counted as unmeasured"
    )
    device = {"uuid": uuid}
    held = registry.get_sample_value("tranche_device_held_seconds_total", device)
    idle = registry.get_sample_value("tranche_device_idle_seconds_total", device)
    assert held == allocated
    assert idle == held  # no process on it when its pod had ended: idle, the tenant's by policy
    assert registry.get_sample_value("tranche_device_unmeasured_seconds_total", device) == 0.0
    assert not registry.get_sample_value("tranche_errors_total", {"reason": "nvml"})
