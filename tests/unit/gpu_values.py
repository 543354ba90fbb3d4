"""Hand-written NVML values for inventory and slice tests (H100- and A100-like GPUs).

The placement tables are those of ``nvidia-smi mig -lgipp`` on A100/H100-class
GPUs; per-profile engine counts are plausible, not authoritative.
"""

from __future__ import annotations

from dataclasses import replace

from driver.nvml.types import GpuInfo, MigInstance, MigProfile, SystemInfo

MIB = 2**20
SYSTEM = SystemInfo(driver_version="535.104.05", cuda_driver_version=(12, 2))


def _p(
    pid: int, name: str, slices: int, mib: int, sms: int, count: int, starts: tuple[int, ...],
    size: int, ce: int = 1, dec: int = 0, jpg: int = 0, ofa: int = 0,
) -> MigProfile:  # fmt: skip
    return MigProfile(
        id=pid, name=name, slice_count=slices, memory_bytes=mib * MIB, multiprocessors=sms,
        copy_engines=ce, decoders=dec, encoders=0, jpeg_engines=jpg, ofa_engines=ofa,
        instance_count=count, placements=tuple((s, size) for s in starts),
    )  # fmt: skip


H100_PROFILES = (
    _p(19, "1g.10gb", 1, 9856, 16, 7, (0, 1, 2, 3, 4, 5, 6), 1, dec=1, jpg=1),
    _p(20, "1g.10gb+me", 1, 9856, 16, 1, (0, 1, 2, 3, 4, 5, 6), 1, dec=7, jpg=7, ofa=1),
    _p(15, "1g.20gb", 1, 19968, 26, 4, (0, 2, 4, 6), 2, dec=1, jpg=1),
    _p(14, "2g.20gb", 2, 19968, 32, 3, (0, 2, 4), 2, ce=2, dec=2, jpg=2),
    _p(9, "3g.40gb", 3, 40192, 60, 2, (0, 4), 4, ce=3, dec=3, jpg=3),
    _p(5, "4g.40gb", 4, 40192, 64, 1, (0,), 4, ce=4, dec=4, jpg=4),
    _p(0, "7g.80gb", 7, 80384, 132, 1, (0,), 8, ce=8, dec=7, jpg=7, ofa=1),
)


def h100(
    n: int, *, uuid: str | None = None, peers: tuple[str, ...] = (), mig_enabled: bool = False
) -> GpuInfo:
    return GpuInfo(
        index=n,
        uuid=uuid or f"GPU-{n:08x}-aaaa-bbbb-cccc-{n:012x}",
        minor=n,
        product_name="NVIDIA H100 80GB HBM3",
        brand="Nvidia",
        architecture="Hopper",
        cuda_compute_capability=(9, 0),
        memory_bytes=81559 * MIB,
        pci_bus_id=f"00000000:{0x18 + n:02X}:00.0",
        pcie_root=f"pci0000:{0x15 + n:02x}",
        numa_node=n // 4,
        multiprocessors=132,
        copy_engines=8,
        decoders=7,
        encoders=0,
        jpeg_engines=7,
        ofa_engines=1,
        mig_capable=True,
        mig_enabled=mig_enabled,
        mig_pending=mig_enabled,
        mig_toggle_without_reset=True,
        memory_slices=8,
        mig_profiles=H100_PROFILES,
        nvlink_peers=peers,
    )


def a100(n: int, *, mig_enabled: bool) -> GpuInfo:
    return replace(
        h100(n, mig_enabled=mig_enabled),
        product_name="NVIDIA A100-SXM4-80GB",
        architecture="Ampere",
        cuda_compute_capability=(8, 0),
        mig_toggle_without_reset=False,
    )


def l4(n: int) -> GpuInfo:
    return replace(
        h100(n),
        product_name="NVIDIA L4",
        architecture="Ada Lovelace",
        cuda_compute_capability=(8, 9),
        memory_bytes=23034 * MIB,
        multiprocessors=58,
        mig_capable=False,
        memory_slices=0,
        mig_profiles=(),
    )


def instance(gpu: GpuInfo, profile_name: str, start: int, gi_id: int = 1) -> MigInstance:
    profile = next(p for p in gpu.mig_profiles if p.name == profile_name)
    size = profile.placements[0][1]
    return MigInstance(
        uuid=f"MIG-{gi_id:08x}-0000-0000-0000-{gpu.index:012x}",
        parent_uuid=gpu.uuid,
        profile_id=profile.id,
        profile_name=profile.name,
        gi_id=gi_id,
        ci_id=0,
        placement=(start, size),
        memory_bytes=profile.memory_bytes,
    )
