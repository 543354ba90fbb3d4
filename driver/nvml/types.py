"""Typed values the NVML facade returns.

These are the only NVML shapes the rest of Tranche sees. The facade
(:mod:`driver.nvml.facade`) fills them from the ``pynvml`` module, real or
simulated; nothing above the facade touches ``pynvml`` objects.
"""

from __future__ import annotations

from dataclasses import dataclass, field

MIG_UUID_PREFIX = "MIG-"  # NVML's MIG device UUIDs; a GPU's start with "GPU-"


def is_mig_uuid(uuid: str) -> bool:
    """Whether ``uuid`` names a MIG device (each one made gets a UUID of its own)."""
    return uuid.startswith(MIG_UUID_PREFIX)


@dataclass(frozen=True)
class MigProfile:
    """A GPU-instance profile as NVML reports it (``nvmlDeviceGetGpuInstanceProfileInfo``)."""

    id: int  # NVML GI profile id, e.g. 19 for 1g.10gb on H100
    name: str  # "1g.10gb", "1g.10gb+me", "7g.80gb"
    slice_count: int  # compute slices (the "g" of the name)
    memory_bytes: int  # memorySizeMB * 2**20 (NVML's MB is MiB)
    multiprocessors: int
    copy_engines: int
    decoders: int
    encoders: int
    jpeg_engines: int
    ofa_engines: int
    instance_count: int  # how many of this profile fit on an empty GPU
    placements: tuple[tuple[int, int], ...]  # (start, size) in memory slices


@dataclass(frozen=True)
class MigInstance:
    """An existing MIG device: a GPU instance plus its (single, full) compute instance."""

    uuid: str  # "MIG-..."
    parent_uuid: str
    profile_id: int
    profile_name: str
    gi_id: int
    ci_id: int
    placement: tuple[int, int]  # (start, size)
    memory_bytes: int


@dataclass(frozen=True)
class GpuInfo:
    """A physical GPU as discovered through NVML."""

    index: int  # NVML index: unstable, never used in names
    uuid: str  # "GPU-..."
    minor: int  # /dev/nvidia<minor>
    product_name: str  # "NVIDIA H100 80GB HBM3"
    brand: str  # "Nvidia", "Tesla", ...
    architecture: str  # "Hopper", "Ampere", "Ada Lovelace"
    cuda_compute_capability: tuple[int, int]
    memory_bytes: int
    pci_bus_id: str  # "0000:18:00.0" (domain:bus:device.function, lowercase hex)
    pcie_root: str | None  # "pci0000:15", None when unknown
    numa_node: int | None
    # SMs and engines: NVML reports them only for MIG profiles and devices
    # (nvmlDeviceGetAttributes refuses a whole GPU's handle), so these are the largest
    # MIG profile's, and None (unknown) on a GPU without MIG.
    multiprocessors: int | None
    copy_engines: int | None
    decoders: int | None
    encoders: int | None
    jpeg_engines: int | None
    ofa_engines: int | None
    mig_capable: bool
    mig_enabled: bool  # current MIG mode
    mig_pending: bool  # pending MIG mode (applies after reset on Ampere)
    mig_toggle_without_reset: bool  # Hopper and later
    memory_slices: int  # 8 on A100/H100/H200, 0 when not MIG-capable
    mig_profiles: tuple[MigProfile, ...] = ()
    mig_instances: tuple[MigInstance, ...] = ()
    nvlink_peers: tuple[str, ...] = ()  # UUIDs of GPUs reachable over active NVLinks
    fabric_clique: str | None = None  # NVLink domain id where NVSwitch/fabric reports one
    mig_error: str | None = None  # NVML's MIG query failed: profiles and instances unknown


@dataclass(frozen=True)
class SystemInfo:
    driver_version: str  # "570.133.20"
    cuda_driver_version: tuple[int, int]  # (12, 8)


@dataclass(frozen=True)
class XidEvent:
    """An NVML event: an XID critical error, an ECC error, or a GPU that was lost."""

    gpu_uuid: str
    kind: str  # "xid" | "ecc-double-bit" | "ecc-single-bit" | "gpu-lost" | "recovered"
    code: int  # the XID number; 0 for non-XID kinds
    timestamp: float  # seconds since the epoch
    recovery_action: str | None = None  # NVML's nvmlDeviceGetRecoveryAction, where reported
    gi_id: int | None = None  # MIG GPU instance the event is attributed to; None: whole GPU
    ci_id: int | None = None  # MIG compute instance; None: whole GPU or whole GI
    # (GI profile id, first memory slice) of ``gi_id``; None: whole GPU, or NVML could not tell
    mig_slot: tuple[int, int] | None = None


@dataclass(frozen=True)
class DeviceProbe:
    """The result of a health probe of one GPU (a cheap NVML query on its handle)."""

    uuid: str
    healthy: bool
    lost: bool  # NVML_ERROR_GPU_IS_LOST: the GPU fell off the bus
    code: int = 0  # the NVML return code of the failed query; 0 when healthy
    detail: str = ""


@dataclass(frozen=True)
class ProcessUsage:
    """A process on a GPU or MIG device, with its sampled usage."""

    pid: int
    device_uuid: str  # GPU or MIG UUID it runs on
    used_memory_bytes: int
    sm_util_percent: float  # from nvmlDeviceGetProcessUtilization; 0 when not sampled
    cgroup: str = ""  # /proc/<pid>/cgroup content (simulation fills it in)


@dataclass(frozen=True)
class DeviceUsage:
    uuid: str
    gpu_util_percent: float
    memory_used_bytes: int
    memory_total_bytes: int
    processes: tuple[ProcessUsage, ...] = field(default_factory=tuple)


@dataclass(frozen=True)
class MemoryLimit:
    """The driver-enforced memory limit of one cgroup on one GPU (``nvmlDeviceGetMemoryLimits_v1``).

    ``soft_bytes`` / ``hard_bytes`` are None where no limit is set (NVML's "max").
    """

    gpu_uuid: str
    cgroup: str
    soft_bytes: int | None
    hard_bytes: int | None
    used_bytes: int
