"""A :class:`NodePlugin` over simulated GPUs in a temporary directory, for tests that need
the whole object graph but no socket, thread or API server call."""

from __future__ import annotations

from pathlib import Path

from prometheus_client import CollectorRegistry

from driver.devices.inventory import AdvertiseConfig
from driver.health.policy import HealthPolicy
from driver.kube.http import KubeClient
from driver.metrics import Metrics
from driver.nvml.sim import create_state, open_simulated
from driver.sharing import SharingConfig
from kubelet_plugin.node import NodePlugin
from kubelet_plugin.settings import PluginSettings


def sim_plugin(
    tmp_path: Path,
    kube: KubeClient,
    node: str = "node-a",
    advertise: AdvertiseConfig | None = None,
    sharing: SharingConfig | None = None,
    registry: CollectorRegistry | None = None,
    health_policy: HealthPolicy | None = None,
    sweep_interval_s: float = 60.0,
) -> NodePlugin:
    create_state("dgx-h100", tmp_path / "sim.json")
    settings = PluginSettings(
        node_name=node,
        advertise=advertise or AdvertiseConfig(),
        nvml="simulated",
        kubelet_root_dir=tmp_path / "kubelet",
        cdi_root=tmp_path / "cdi",
        state_dir=tmp_path / "state",
        sim_state=tmp_path / "sim.json",
        sharing=sharing or SharingConfig(),
        health_policy=health_policy or HealthPolicy(),
        sweep_interval_s=sweep_interval_s,
    )
    registry = registry or CollectorRegistry()
    return NodePlugin(
        settings, kube, open_simulated(tmp_path / "sim.json"), registry, Metrics(registry)
    )
