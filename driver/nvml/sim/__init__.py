"""A simulated NVML: the same ``pynvml`` surface over simulated GPUs.

``open_simulated(path)`` gives an :class:`~driver.nvml.facade.Nvml` over a
state file created by ``tranche sim init``; ``SimControl`` injects faults,
processes and load into the same file.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from driver.nvml.facade import Nvml, OnCall
from driver.nvml.sim.control import SimControl
from driver.nvml.sim.driver_root import SimGpuLine, create_driver_root
from driver.nvml.sim.host import SimHost, SimTimeslice
from driver.nvml.sim.lib import SimulatedNvmlLib
from driver.nvml.sim.profiles import NodeProfile, load_profile, shipped_profiles
from driver.nvml.sim.state import SimState, SimStore, state_from_profile
from driver.nvml.types import GpuInfo, SystemInfo

__all__ = [
    "PROC_DEVICES",
    "NodeProfile",
    "SimControl",
    "SimState",
    "SimStore",
    "SimulatedNvmlLib",
    "create_state",
    "load_profile",
    "open_simulated",
    "shipped_profiles",
    "write_driver_root",
]

# The character-device majors of a simulated node, as its /proc/devices would list them:
# 195 is fixed by the NVIDIA driver; the kernel assigns nvidia-uvm's and nvidia-caps' (these
# are the numbers seen on a typical node).
PROC_DEVICES = """Character devices:
195 nvidia-frontend
195 nvidia
234 nvidia-caps
510 nvidia-uvm
"""


def create_state(profile: str, path: Path | None = None, *, node: str | None = None) -> SimStore:
    """Fresh simulated hardware from a profile name or file, optionally backed by ``path``.

    ``node`` makes the GPU UUIDs the node's own (two nodes of one profile differ); without
    it they depend on the profile alone.
    """
    return SimStore(state_from_profile(load_profile(profile), node), path)


def open_simulated(store: SimStore | Path, *, on_call: OnCall | None = None) -> Nvml:
    """An initialised :class:`Nvml` over simulated GPUs (a store or a state file)."""
    if not isinstance(store, SimStore):
        store = SimStore(path=store)
    nvml = Nvml(
        SimulatedNvmlLib(store),
        host=SimHost(store),
        timeslice=SimTimeslice(store),
        on_call=on_call,
    )
    nvml.init()
    return nvml


def write_driver_root(root: Path, system: SystemInfo, gpus: Sequence[GpuInfo]) -> Path:
    """The simulated driver root (:mod:`driver.nvml.sim.driver_root`) of a node whose NVML
    reports ``system`` and ``gpus``, written at ``root``."""
    lines = [
        SimGpuLine(g.index, g.product_name, g.uuid, g.memory_bytes >> 20, g.minor) for g in gpus
    ]
    major, minor = system.cuda_driver_version
    return create_driver_root(root, system.driver_version, f"{major}.{minor}", lines)
