"""Node profiles for the simulated NVML: which GPUs a simulated node has.

A profile is a JSON file (shipped ones live in ``driver/nvml/profiles/``) that
names GPU *models* once (product name, architecture, memory, engines, MIG GI
profiles and placements, exactly as NVML reports them) and then lists the
node's GPUs (PCI bus id, PCIe root, NUMA node, NVLink domain). UUIDs are
derived from the profile name and the PCI bus id, so device names stay the
same from run to run.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from driver.errors import ConfigError

PROFILE_DIR = Path(__file__).resolve().parent.parent / "profiles"
_UUID_NAMESPACE = uuid.UUID("6f1c7d0e-3b2a-4a5e-9d43-7a1d2c0b9e11")

# NVML GI profile *indexes* (the argument of nvmlDeviceGetGpuInstanceProfileInfo), by the
# suffix of their pynvml constant NVML_GPU_INSTANCE_PROFILE_<suffix>.
GI_PROFILE_INDEX = {
    "1_SLICE": 0x0,
    "2_SLICE": 0x1,
    "3_SLICE": 0x2,
    "4_SLICE": 0x3,
    "7_SLICE": 0x4,
    "8_SLICE": 0x5,
    "6_SLICE": 0x6,
    "1_SLICE_REV1": 0x7,
    "2_SLICE_REV1": 0x8,
    "1_SLICE_REV2": 0x9,
}
ARCHITECTURES = {"AMPERE": 7, "ADA": 8, "HOPPER": 9, "BLACKWELL": 10}
BRANDS = {"TESLA": 2, "NVIDIA": 14}


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Placements(_Frozen):
    starts: tuple[int, ...]
    size: int = Field(gt=0)


class GiProfileSpec(_Frozen):
    """One GPU-instance profile, as ``nvidia-smi mig -lgip`` / ``-lgipp`` show it."""

    index: str  # NVML_GPU_INSTANCE_PROFILE_<index>
    id: int
    name: str
    slices: int = Field(gt=0)  # compute slices
    instances: int = Field(gt=0)
    memory_mib: int = Field(gt=0)
    multiprocessors: int = Field(gt=0)
    copy_engines: int = Field(ge=0)
    decoders: int = Field(ge=0)
    encoders: int = Field(ge=0)
    jpeg_engines: int = Field(ge=0)
    ofa_engines: int = Field(ge=0)
    placements: Placements

    @field_validator("index")
    @classmethod
    def _known_index(cls, value: str) -> str:
        if value not in GI_PROFILE_INDEX:
            raise ValueError(
                f"unknown GI profile index {value!r}; one of {sorted(GI_PROFILE_INDEX)}"
            )
        return value

    @property
    def nvml_index(self) -> int:
        return GI_PROFILE_INDEX[self.index]


class MigSpec(_Frozen):
    memory_slices: int = Field(gt=0)
    mode_toggle_needs_reset: bool  # Ampere: a MIG mode change stays pending until a GPU reset
    max_devices: int = Field(gt=0)
    gpu_instance_profiles: tuple[GiProfileSpec, ...]


class ModelSpec(_Frozen):
    """A GPU model: everything NVML reports that does not depend on the slot."""

    product_name: str
    brand: str
    architecture: str
    compute_capability: tuple[int, int]
    memory_total_mib: int = Field(gt=0)
    multiprocessors: int = Field(gt=0)
    copy_engines: int = Field(ge=0)
    decoders: int = Field(ge=0)
    encoders: int = Field(ge=0)
    jpeg_engines: int = Field(ge=0)
    ofa_engines: int = Field(ge=0)
    pci_device_id: int
    mig: MigSpec | None = None

    @field_validator("architecture")
    @classmethod
    def _known_arch(cls, value: str) -> str:
        if value not in ARCHITECTURES:
            raise ValueError(f"unknown architecture {value!r}; one of {sorted(ARCHITECTURES)}")
        return value

    @field_validator("brand")
    @classmethod
    def _known_brand(cls, value: str) -> str:
        if value not in BRANDS:
            raise ValueError(f"unknown brand {value!r}; one of {sorted(BRANDS)}")
        return value


class FabricSpec(_Frozen):
    cluster_uuid: str
    clique_id: int


class SlotSpec(_Frozen):
    """One GPU of the node: a model in a PCI slot."""

    model: str
    pci_bus_id: str  # "0000:18:00.0"
    pcie_root: str | None = None  # "pci0000:15"
    numa_node: int | None = None
    nvlink_domain: str | None = None  # GPUs sharing a domain are NVLink peers
    fabric: FabricSpec | None = None
    uuid: str | None = None  # default: derived from the profile name and pci_bus_id


class NodeProfile(_Frozen):
    name: str
    description: str = ""
    driver_version: str
    cuda_driver_version: int  # NVML encoding: 12080 for 12.8
    # The host kernel has the cgroup v2 ``dmem`` controller, so a driver of r615 or later
    # enforces per-cgroup memory limits (``nvmlDeviceSetMemoryLimits_v1``).
    kernel_memory_limits: bool = False
    models: dict[str, ModelSpec]
    gpus: tuple[SlotSpec, ...]

    def gpu_uuid(self, slot: SlotSpec, node: str | None = None) -> str:
        """The slot's UUID: its own, else derived from the node (when named), the profile
        and the bus id, so two simulated nodes of one profile never share a GPU UUID."""
        if slot.uuid:
            return slot.uuid
        seed = f"{self.name}/{slot.pci_bus_id}"
        return "GPU-" + str(uuid.uuid5(_UUID_NAMESPACE, f"{node}/{seed}" if node else seed))


def shipped_profiles() -> list[str]:
    """Names of the profiles shipped with Tranche."""
    return sorted(p.stem for p in PROFILE_DIR.glob("*.json"))


def load_profile(name_or_path: str) -> NodeProfile:
    """Load a shipped profile by name (``dgx-h100``) or a profile file by path."""
    path = Path(name_or_path)
    if not path.suffix and not path.exists():
        path = PROFILE_DIR / f"{name_or_path}.json"
    if not path.is_file():
        raise ConfigError(
            f"simulation profile {name_or_path!r}: no such file; "
            f"shipped profiles: {', '.join(shipped_profiles())}"
        )
    try:
        raw = json.loads(path.read_text())
        profile = NodeProfile.model_validate(raw)
    except (json.JSONDecodeError, ValidationError) as e:
        raise ConfigError(f"simulation profile {path}: invalid: {e}") from e
    for slot in profile.gpus:
        if slot.model not in profile.models:
            raise ConfigError(
                f"simulation profile {path}: gpus[pci_bus_id={slot.pci_bus_id}].model "
                f"{slot.model!r} is not one of {sorted(profile.models)}"
            )
    return profile
