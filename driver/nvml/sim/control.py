"""Driving the simulated hardware: faults, processes and load, as a test or an operator would.

:class:`SimControl` changes a :class:`~driver.nvml.sim.state.SimStore`; a plugin
reading the same state file (through :class:`~driver.nvml.sim.lib.SimulatedNvmlLib`)
sees the change at its next NVML call, as it would see real hardware change.
"""

from __future__ import annotations

import pynvml

from driver.errors import DeviceNotFound
from driver.nvml.sim.calls import mig_uuid
from driver.nvml.sim.state import SimEvent, SimGpu, SimProcess, SimState, SimStore

WHOLE = 0xFFFFFFFF  # the GI / CI id of an event of the whole GPU
RECOVERY_ACTIONS = {
    "NONE": pynvml.NVML_GPU_RECOVERY_ACTION_NONE,
    "GPU_RESET": pynvml.NVML_GPU_RECOVERY_ACTION_GPU_RESET,
    "NODE_REBOOT": pynvml.NVML_GPU_RECOVERY_ACTION_NODE_REBOOT,
    "DRAIN_P2P": pynvml.NVML_GPU_RECOVERY_ACTION_DRAIN_P2P,
    "DRAIN_AND_RESET": pynvml.NVML_GPU_RECOVERY_ACTION_DRAIN_AND_RESET,
}
NVML_ERRORS = {
    code: name.removeprefix("NVML_ERROR_")
    for name, code in vars(pynvml).items()
    if name.startswith("NVML_ERROR_") and isinstance(code, int)
}


def find_gpu(state: SimState, gpu: str | int) -> SimGpu:
    """A GPU by NVML index, UUID, or the UUID of one of its MIG devices."""
    text = str(gpu)
    for g in state.gpus:
        if text in (str(g.index), g.uuid) or any(
            i.ci_id is not None and mig_uuid(g, i) == text for i in g.instances
        ):
            return g
    known = ", ".join(f"{g.index}={g.uuid}" for g in state.gpus)
    raise DeviceNotFound(f"simulated GPU {text!r} not found; GPUs: {known}")


def _device_uuids(gpu: SimGpu) -> list[str]:
    return [gpu.uuid] + [mig_uuid(gpu, i) for i in gpu.instances if i.ci_id is not None]


class SimControl:
    """Fault injection and load for simulated GPUs."""

    def __init__(self, store: SimStore) -> None:
        self.store = store

    def inject_xid(
        self,
        gpu: str | int,
        xid: int,
        *,
        recovery_action: str | None = None,
        gi_id: int | None = None,
        ci_id: int | None = None,
    ) -> None:
        """Raise an XID critical-error event; optionally set NVML's recovery action.

        As real NVML, the event names the GPU instance and compute instance of the MIG
        device ``gpu`` names by its UUID, and 0xFFFFFFFF (the whole GPU) for a GPU;
        ``gi_id`` and ``ci_id`` set them explicitly.
        """
        action = None
        if recovery_action is not None:
            key = recovery_action.upper().replace("-", "_")
            if key not in RECOVERY_ACTIONS:
                known = sorted(RECOVERY_ACTIONS)
                raise ValueError(f"recovery action {recovery_action!r} unknown; one of {known}")
            action = RECOVERY_ACTIONS[key]

        def change(state: SimState) -> None:
            g = find_gpu(state, gpu)
            if action is not None:
                g.recovery_action = action
            mig = next(
                (i for i in g.instances if i.ci_id is not None and mig_uuid(g, i) == gpu), None
            )
            gi, ci = (WHOLE, WHOLE) if mig is None else (mig.gi_id, mig.ci_id or 0)
            state.add_event(
                SimEvent(
                    seq=0,
                    gpu_index=g.index,
                    event_type=pynvml.nvmlEventTypeXidCriticalError,
                    data=xid,
                    gi_id=gi if gi_id is None else gi_id,
                    ci_id=ci if ci_id is None else ci_id,
                )
            )

        self.store.update(change)

    def inject_ecc(self, gpu: str | int, *, double_bit: bool) -> None:
        kind = (
            pynvml.nvmlEventTypeDoubleBitEccError
            if double_bit
            else pynvml.nvmlEventTypeSingleBitEccError
        )

        def change(state: SimState) -> None:
            state.add_event(SimEvent(seq=0, gpu_index=find_gpu(state, gpu).index, event_type=kind))

        self.store.update(change)

    def lose_gpu(self, gpu: str | int) -> None:
        """The GPU falls off the bus: XID 79, then every call on it fails with GPU_IS_LOST."""

        def change(state: SimState) -> None:
            g = find_gpu(state, gpu)
            g.lost = True
            g.recovery_action = pynvml.NVML_GPU_RECOVERY_ACTION_NODE_REBOOT
            state.add_event(
                SimEvent(
                    seq=0,
                    gpu_index=g.index,
                    event_type=pynvml.nvmlEventTypeXidCriticalError,
                    data=79,
                )
            )
            state.add_event(SimEvent(seq=0, gpu_index=g.index, event_type=0))

        self.store.update(change)

    def recover(self, gpu: str | int) -> None:
        """Reset the GPU: back on the bus, MIG instances and processes gone, pending MIG mode on."""

        def change(state: SimState) -> None:
            g = find_gpu(state, gpu)
            g.lost = False
            g.instances = []
            g.processes = []
            g.mig_current = g.mig_pending
            g.recovery_action = pynvml.NVML_GPU_RECOVERY_ACTION_NONE
            g.gpu_util = g.memory_util = None

        self.store.update(change)

    def fail_mig_create(self, gpu: str | int, error: str | None) -> None:
        """Make every GPU-instance create on the GPU fail with NVML error ``error`` (the
        name after ``NVML_ERROR_``, e.g. ``INSUFFICIENT_RESOURCES`` or ``insufficient-resources``);
        None: succeed again."""
        code = 0
        if error is not None:
            code = getattr(pynvml, f"NVML_ERROR_{error.upper().replace('-', '_')}", 0)
            if not isinstance(code, int) or code == 0:
                raise ValueError(f"NVML error {error!r} unknown; e.g. INSUFFICIENT_RESOURCES")

        def change(state: SimState) -> None:
            find_gpu(state, gpu).mig_create_error = code

        self.store.update(change)

    def reboot(self) -> None:
        """The machine reboots: on every GPU the MIG instances, processes, time slice and
        compute mode are gone (MIG mode and a lost GPU stay as they were)."""

        def change(state: SimState) -> None:
            for g in state.gpus:
                g.instances = []
                g.processes = []
                g.timeslice = 0
                g.compute_mode = 0
                g.memory_limits = {}

        self.store.update(change)

    def add_process(
        self,
        device_uuid: str,
        pid: int,
        *,
        used_memory_bytes: int,
        sm_util: int = 0,
        mem_util: int = 0,
        cgroup: str = "",
    ) -> None:
        """Start a process on a GPU or MIG device (``cgroup`` is its /proc/<pid>/cgroup)."""

        def change(state: SimState) -> None:
            g = find_gpu(state, device_uuid)
            if device_uuid not in _device_uuids(g):
                raise DeviceNotFound(
                    f"simulated device {device_uuid!r}: give a GPU or MIG UUID, not an index"
                )
            g.processes = [p for p in g.processes if p.pid != pid]
            g.processes.append(
                SimProcess(
                    pid=pid,
                    device_uuid=device_uuid,
                    used_memory_bytes=used_memory_bytes,
                    sm_util=sm_util,
                    mem_util=mem_util,
                    cgroup=cgroup,
                )
            )

        self.store.update(change)

    def remove_process(self, pid: int) -> bool:
        def change(state: SimState) -> bool:
            removed = False
            for g in state.gpus:
                before = len(g.processes)
                g.processes = [p for p in g.processes if p.pid != pid]
                removed = removed or len(g.processes) != before
            return removed

        return self.store.update(change)

    def set_utilization(
        self, gpu: str | int, *, gpu_percent: int | None, memory_percent: int | None = None
    ) -> None:
        """Fix the device utilisation NVML reports (None: derived from the processes)."""

        def change(state: SimState) -> None:
            g = find_gpu(state, gpu)
            g.gpu_util, g.memory_util = gpu_percent, memory_percent

        self.store.update(change)

    def set_temperature(self, gpu: str | int, celsius: int) -> None:
        def change(state: SimState) -> None:
            find_gpu(state, gpu).temperature_c = celsius

        self.store.update(change)
