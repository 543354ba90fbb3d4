"""The node's devices as Tranche advertises them.

An :class:`Inventory` is built once from what the NVML facade reports (GPUs,
their MIG profiles and placements, existing MIG instances, driver versions)
and a per-node :class:`AdvertiseConfig`. It names every device (see
``docs/devices.md``), decides which devices are advertised, and answers
look-ups by name or UUID. It is pure: no NVML calls, no API calls.

Device kinds:

* :class:`GpuDevice` — a whole physical GPU, ``gpu-<8 hex of the UUID>``.
* :class:`MigDevice` — a MIG slot, ``<gpu>-mig-<profile>-<start>``. A *dynamic*
  slot is a placement the driver can create on demand; a *static* slot is an
  instance that already exists and was not created by the driver for a claim.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from pydantic import Field, RootModel, ValidationError, field_validator

from driver.errors import ConfigError, DeviceNotFound
from driver.flags import flag_text
from driver.json_or_yaml import NotJsonOrYaml, parse_json_or_yaml
from driver.nvml.types import GpuInfo, MigInstance, MigProfile, SystemInfo


class DeviceType(StrEnum):
    """A kind of device that can be advertised for a GPU.

    * ``gpu``: the whole GPU.
    * ``mig``: every MIG placement NVML lists (dynamic MIG: the driver creates the instance
      for a claim), plus the instances that exist.
    * ``mig-enabled``: MIG only where an operator put the GPU in MIG mode: the instances that
      exist and, on a GPU that needs a reset to leave MIG mode (A100, A30), its placements.
      No dynamic placements on a GPU that switches MIG mode by itself (Hopper and later).
    """

    GPU = "gpu"
    MIG = "mig"
    MIG_ENABLED = "mig-enabled"


# Every placement of a Hopper costs the control plane about 25 devices per GPU (docs/devices.md,
# "What advertising costs the control plane"), so dynamic MIG is opted into per GPU, product or
# node; what an operator already partitioned by hand is still advertised.
DEFAULT_TYPES: tuple[DeviceType, ...] = (DeviceType.GPU, DeviceType.MIG_ENABLED)


class AdvertiseConfig(RootModel[dict[str, tuple[DeviceType, ...]]]):
    """Which device types each GPU of the node advertises.

    Keys are ``"*"`` (every GPU), a product name (``"NVIDIA A100-SXM4-40GB"``)
    or a GPU UUID (``"GPU-..."``); the most specific key wins (UUID, then
    product, then ``"*"``). A GPU no key matches advertises ``gpu`` and
    ``mig-enabled``. An empty list hides the GPU. ``mig`` on a GPU that cannot do MIG
    is ignored.
    """

    root: dict[str, tuple[DeviceType, ...]] = Field(default_factory=lambda: {"*": DEFAULT_TYPES})

    model_config = {"frozen": True}

    @field_validator("root")
    @classmethod
    def _check(cls, value: dict[str, tuple[DeviceType, ...]]) -> dict[str, tuple[DeviceType, ...]]:
        for key, types in value.items():
            if not key.strip():
                raise ValueError("an empty key; use '*', a product name or a GPU UUID")
            if len(set(types)) != len(types):
                raise ValueError(f"key {key!r} lists a device type twice: {list(types)}")
        return value

    def types_for(self, gpu: GpuInfo) -> tuple[DeviceType, ...]:
        """The device types ``gpu`` advertises under this configuration."""
        for key in (gpu.uuid, gpu.product_name, "*"):
            if key in self.root:
                return self.root[key]
        return DEFAULT_TYPES

    @classmethod
    def parse(cls, text: str, source: str = "advertise config") -> AdvertiseConfig:
        """Parse JSON or YAML text (``{"*": ["gpu", "mig"]}``); errors name ``source``."""
        try:
            data: Any = parse_json_or_yaml(text) if text.strip() else {"*": list(DEFAULT_TYPES)}
        except NotJsonOrYaml as e:
            raise ConfigError(f"{source}: not valid JSON or YAML: {e}") from e
        try:
            return cls.model_validate(data)
        except ValidationError as e:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in err['loc'][1:]) or '(top level)'}: {err['msg']}"
                for err in e.errors()
            )
            raise ConfigError(
                f"{source}: expected a mapping of '*', product name or GPU UUID to a list of "
                f"device types ({', '.join(t.value for t in DeviceType)}): {problems}"
            ) from e

    def to_json(self) -> str:
        return json.dumps({k: [t.value for t in v] for k, v in self.root.items()}, sort_keys=True)

    def with_dynamic_mig(self) -> AdvertiseConfig:
        """This configuration on a node opted into dynamic MIG: ``mig-enabled`` becomes ``mig``
        in every entry (and for GPUs no key matches); other entries stay as they are."""

        def promote(types: tuple[DeviceType, ...]) -> tuple[DeviceType, ...]:
            out = [DeviceType.MIG if t is DeviceType.MIG_ENABLED else t for t in types]
            return tuple(dict.fromkeys(out))

        root = {k: promote(v) for k, v in self.root.items()}
        root.setdefault("*", promote(DEFAULT_TYPES))
        return AdvertiseConfig(root)


# Whole GPUs and every MIG placement on every GPU: dynamic MIG opted in everywhere (tests, the
# benchmarks and ``--advertise '{"*": ["gpu", "mig"]}'``).
DYNAMIC_MIG = AdvertiseConfig({"*": (DeviceType.GPU, DeviceType.MIG)})


@dataclass(frozen=True)
class GpuDevice:
    """A whole physical GPU."""

    name: str
    info: GpuInfo
    advertised: bool  # False: the GPU is known (its MIG slots may be) but not offered whole
    nvlink_domain: str | None  # shared by GPUs connected over NVLink; None without NVLink

    @property
    def type(self) -> DeviceType:
        return DeviceType.GPU

    @property
    def uuid(self) -> str:
        return self.info.uuid


@dataclass(frozen=True)
class MigDevice:
    """A MIG slot on a GPU: a placement of a GPU-instance profile."""

    name: str
    parent: GpuInfo
    parent_name: str
    profile: MigProfile
    start: int  # first memory slice
    size: int  # memory slices
    instance: MigInstance | None = None  # the existing instance of a static slot

    @property
    def type(self) -> DeviceType:
        return DeviceType.MIG

    @property
    def uuid(self) -> str | None:
        return self.instance.uuid if self.instance is not None else None

    @property
    def static(self) -> bool:
        return self.instance is not None

    @property
    def memory_slices(self) -> range:
        return range(self.start, self.start + self.size)


Device = GpuDevice | MigDevice


@dataclass(frozen=True)
class Inventory:
    """The node's GPUs and the devices advertised for them, in a stable order."""

    gpus: tuple[GpuDevice, ...]
    migs: tuple[MigDevice, ...]
    system: SystemInfo
    notes: tuple[str, ...] = ()  # things an operator should know (stranded GPUs, ...)
    _by_name: dict[str, Device] = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        for gpu in self.gpus:
            self._by_name[gpu.name] = gpu
        for mig in self.migs:
            self._by_name[mig.name] = mig

    def devices(self) -> Iterator[Device]:
        """Every advertised device: per GPU, the whole GPU first, then its MIG slots."""
        for gpu in self.gpus:
            if gpu.advertised:
                yield gpu
            yield from self.migs_of(gpu.name)

    def device_names(self) -> list[str]:
        return [d.name for d in self.devices()]

    def migs_of(self, gpu_name: str) -> tuple[MigDevice, ...]:
        return tuple(m for m in self.migs if m.parent_name == gpu_name)

    def devices_on(self, gpu_name: str) -> list[str]:
        """Names of every advertised device that uses the GPU named ``gpu_name``."""
        gpu = self.gpu_of(gpu_name)
        names = [gpu.name] if gpu.advertised else []
        return names + [m.name for m in self.migs_of(gpu.name)]

    def device(self, name: str) -> Device:
        """The advertised device ``name``; :class:`DeviceNotFound` with close names otherwise."""
        found = self._by_name.get(name)
        if found is None or (isinstance(found, GpuDevice) and not found.advertised):
            advertised = self.device_names()
            close = _close_names(name, advertised)
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            raise DeviceNotFound(
                f"device {name!r} is not advertised on this node ({len(advertised)} devices){hint}",
                matches=close,
            )
        return found

    def gpu_of(self, name: str) -> GpuDevice:
        """The physical GPU behind device ``name`` (a GPU name or a MIG slot name)."""
        found = self._by_name.get(name)
        if isinstance(found, GpuDevice):
            return found
        if isinstance(found, MigDevice):
            gpu = self._by_name[found.parent_name]
            assert isinstance(gpu, GpuDevice)
            return gpu
        return self._gpu_not_found(name)

    def by_uuid(self, uuid: str) -> Device:
        """The GPU or static MIG slot with this UUID (``GPU-...`` or ``MIG-...``)."""
        for gpu in self.gpus:
            if gpu.uuid == uuid:
                return gpu
        for mig in self.migs:
            if mig.uuid == uuid:
                return mig
        raise DeviceNotFound(f"no GPU or MIG device with UUID {uuid!r} on this node")

    def _gpu_not_found(self, name: str) -> GpuDevice:
        known = [g.name for g in self.gpus] + [m.name for m in self.migs]
        close = _close_names(name, known)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise DeviceNotFound(f"device {name!r} is not on this node{hint}", matches=close)


# A GPU's device name, ``gpu-<hex>`` (:func:`gpu_names`), as a regular expression: the
# names of its MIG and share devices start with it.
GPU_NAME_PATTERN = r"gpu-[0-9a-f]+"


def uuid_hex(uuid: str) -> str:
    """The hex digits of a GPU UUID, from which :func:`gpu_names` makes its name."""
    return re.sub(r"[^0-9a-f]", "", uuid.lower().removeprefix("gpu-"))


def gpu_names(uuids: Iterable[str]) -> dict[str, str]:
    """``gpu-<8 hex>`` per UUID; 16 hex digits for the GPUs whose first 8 collide."""
    uuid_list = list(uuids)
    short: dict[str, list[str]] = {}
    for uuid in uuid_list:
        short.setdefault(uuid_hex(uuid)[:8], []).append(uuid)
    names: dict[str, str] = {}
    for group in short.values():
        digits = 16 if len(group) > 1 else 8
        for uuid in group:
            names[uuid] = f"gpu-{uuid_hex(uuid)[:digits]}"
    return names


def profile_token(profile_name: str) -> str:
    """``1g.10gb+me`` → ``1g10gbme``: the profile as it appears in device names.

    A ``-`` (Blackwell's ``1g.24gb-me``, no media engines: NVML's ``*_NO_ME`` profiles)
    becomes ``no``, so that it does not share a name with ``1g.24gb+me`` at the same
    placement (two devices of one name make the API server refuse the node's slices);
    ``1g.24gb+me.all`` (``*_ALL_ME``) is ``1g24gbmeall``."""
    return re.sub(r"[^a-z0-9]", "", profile_name.lower().replace("-", "no"))


def mig_name(gpu_name: str, profile_name: str, start: int) -> str:
    return f"{gpu_name}-mig-{profile_token(profile_name)}-{start}"


def nvlink_domains(gpus: Sequence[GpuInfo]) -> dict[str, str]:
    """An NVLink domain id per GPU UUID, for GPUs that have NVLink peers or a fabric clique.

    A fabric clique (NVSwitch systems) is used as reported. Otherwise GPUs are
    grouped into the connected components of the NVLink peer graph and each
    component is named by a hash of its sorted UUIDs, so the id is the same on
    every restart and differs between unconnected groups.
    """
    on_node = {g.uuid for g in gpus}
    neighbours: dict[str, set[str]] = {g.uuid: set() for g in gpus}
    for g in gpus:
        for peer in g.nvlink_peers:
            if peer in on_node and peer != g.uuid:
                neighbours[g.uuid].add(peer)
                neighbours[peer].add(g.uuid)
    domains: dict[str, str] = {}
    seen: set[str] = set()
    for g in sorted(gpus, key=lambda x: x.uuid):
        if g.fabric_clique:
            domains[g.uuid] = _domain_id("clique", g.fabric_clique)
            continue
        if g.uuid in seen or not neighbours[g.uuid]:
            continue
        component, todo = set(), [g.uuid]
        while todo:
            u = todo.pop()
            if u not in component:
                component.add(u)
                todo.extend(neighbours[u] - component)
        seen |= component
        domain = "nvl-" + hashlib.sha256("\n".join(sorted(component)).encode()).hexdigest()[:12]
        for u in component:
            if u not in domains:
                domains[u] = domain
    return domains


def _domain_id(prefix: str, raw: str) -> str:
    clean = re.sub(r"[^A-Za-z0-9._-]", "-", raw)
    value = f"{prefix}-{clean}"
    if len(value) > 64:
        value = f"{prefix}-" + hashlib.sha256(raw.encode()).hexdigest()[:16]
    return value


def build_inventory(
    gpus: Sequence[GpuInfo],
    system: SystemInfo,
    advertise: AdvertiseConfig | None = None,
    managed_mig_uuids: Iterable[str] = (),
    mig_profiles: Collection[str] = (),
) -> Inventory:
    """The advertised devices of a node.

    ``managed_mig_uuids`` are MIG instances the driver created for claims
    (from its checkpoint): they are the dynamic slots they were made from and
    change nothing that is advertised. Every other existing instance is
    *static*: it is advertised with its UUID, and the whole GPU and every
    dynamic slot overlapping it are left out, since they cannot be created
    while it exists.
    ``mig_profiles`` limits dynamic placements to these GPU-instance profiles (empty: every
    profile NVML lists); existing instances are advertised whatever their profile.
    """
    advertise = advertise or AdvertiseConfig()
    managed = set(managed_mig_uuids)
    names = gpu_names(g.uuid for g in gpus)
    domains = nvlink_domains(gpus)
    gpu_devices: list[GpuDevice] = []
    migs: list[MigDevice] = []
    notes: list[str] = []
    for info in sorted(gpus, key=lambda g: names[g.uuid]):
        name = names[info.uuid]
        types = advertise.types_for(info)
        gpu_migs, whole_ok, gpu_notes = _gpu_slots(name, info, types, managed, set(mig_profiles))
        migs.extend(gpu_migs)
        notes.extend(gpu_notes)
        gpu_devices.append(
            GpuDevice(
                name=name,
                info=info,
                advertised=DeviceType.GPU in types and whole_ok,
                nvlink_domain=domains.get(info.uuid),
            )
        )
    return Inventory(gpus=tuple(gpu_devices), migs=tuple(migs), system=system, notes=tuple(notes))


def _gpu_slots(
    name: str, info: GpuInfo, types: Sequence[DeviceType], managed: set[str], only: set[str]
) -> tuple[list[MigDevice], bool, list[str]]:
    """The MIG slots of one GPU, whether the whole GPU can be offered, and notes."""
    notes: list[str] = []
    static = [i for i in info.mig_instances if i.uuid not in managed]
    whole_ok = not static
    if static:
        notes.append(
            f"{name} ({info.uuid}): {len(static)} MIG instance(s) exist that the driver did not "
            "create; the whole GPU and overlapping MIG placements are not advertised"
        )
    if info.mig_error is not None:
        notes.append(_mig_error_note(name, info))
        whole_ok = whole_ok and not info.mig_enabled
    if info.mig_capable and info.mig_enabled and not info.mig_toggle_without_reset:
        whole_ok = False
        notes.append(
            f"{name} ({info.uuid}): MIG mode is on and this GPU needs a reset to leave it; "
            "the whole GPU is not advertised"
        )
    mig_types = {DeviceType.MIG, DeviceType.MIG_ENABLED} & set(types)
    if not mig_types or not info.mig_capable:
        if static and not mig_types:
            notes.append(f"{name}: has MIG instances but 'mig' is not advertised for it")
        return [], whole_ok, notes
    if DeviceType.MIG in types:
        dynamic_ok = info.mig_enabled or info.mig_toggle_without_reset
    else:
        # mig-enabled: placements only where the operator's MIG mode stays on, or where the
        # driver made instances for claims under an earlier setting (their slots and counters
        # stay published until the plugin restarts without them, so the whole GPU is never
        # handed out beside them).
        made_for_claims = any(i.uuid in managed for i in info.mig_instances)
        dynamic_ok = info.mig_enabled and (not info.mig_toggle_without_reset or made_for_claims)
    if DeviceType.MIG in types and not dynamic_ok and not static:
        notes.append(
            f"{name} ({info.uuid}): MIG mode is off and this GPU needs a reset to enable it; "
            "only the whole GPU is advertised"
        )
    profiles = {p.id: p for p in info.mig_profiles}
    taken = {s for inst in static for s in range(inst.placement[0], sum(inst.placement))}
    slots: dict[str, MigDevice] = {}
    for inst in static:
        profile = profiles.get(inst.profile_id) or _profile_of_instance(inst)
        slot_name = mig_name(name, profile.name, inst.placement[0])
        slots[slot_name] = MigDevice(
            slot_name, info, name, profile, inst.placement[0], inst.placement[1], inst
        )
    if dynamic_ok:
        for profile in info.mig_profiles:
            if only and profile.name not in only:
                continue
            for start, size in profile.placements:
                if taken & set(range(start, start + size)):
                    continue
                slot_name = mig_name(name, profile.name, start)
                slots.setdefault(slot_name, MigDevice(slot_name, info, name, profile, start, size))
    ordered = sorted(slots.values(), key=lambda m: (m.size, m.start, m.profile.name))
    return ordered, whole_ok, notes


def _mig_error_note(name: str, info: GpuInfo) -> str:
    held = ", nor the whole GPU (MIG mode is on: instances may exist)" if info.mig_enabled else ""
    return (
        f"{name} ({info.uuid}): NVML's MIG query failed ({info.mig_error}); "
        f"no MIG slot is advertised{held}"
    )


def _profile_of_instance(inst: MigInstance) -> MigProfile:
    """A profile for an instance whose GI profile NVML no longer lists (memory only)."""
    slices = int(m.group(1)) if (m := re.match(r"(\d+)g", inst.profile_name)) else 0
    return MigProfile(
        id=inst.profile_id,
        name=inst.profile_name,
        slice_count=slices,
        memory_bytes=inst.memory_bytes,
        multiprocessors=0,
        copy_engines=0,
        decoders=0,
        encoders=0,
        jpeg_engines=0,
        ofa_engines=0,
        instance_count=0,
        placements=(inst.placement,),
    )


def parse_advertise(value: str | None, env_source: str = "--advertise") -> AdvertiseConfig:
    """``value`` is inline JSON/YAML or ``@path``; empty gives the default."""
    if not value:
        return AdvertiseConfig()
    text, source = flag_text(value, env_source)
    return AdvertiseConfig.parse(text, source=source)


MIG_PROFILE_NAME = re.compile(r"^[0-9]+g\.[0-9]+gb([+-][a-z0-9]+(\.[a-z0-9]+)?)?$")


def parse_mig_profiles(value: str | None, source: str = "--mig-profiles") -> tuple[str, ...]:
    """``1g.10gb,3g.40gb`` → the profile names; empty: every profile (an empty tuple)."""
    names = tuple(dict.fromkeys(n.strip() for n in (value or "").split(",") if n.strip()))
    bad = [n for n in names if not MIG_PROFILE_NAME.match(n)]
    if bad:
        raise ConfigError(
            f"{source}: {', '.join(map(repr, bad))} is not a GPU-instance profile name "
            "such as 1g.10gb or 1g.10gb+me"
        )
    return names


def summary(inventory: Inventory) -> Mapping[str, int]:
    """Device counts by kind, for logs."""
    return {
        "gpus": len(inventory.gpus),
        "whole_gpus": sum(1 for g in inventory.gpus if g.advertised),
        "mig_slots": len(inventory.migs),
        "static_mig": sum(1 for m in inventory.migs if m.static),
    }


def _close_names(name: str, known: Sequence[str]) -> tuple[str, ...]:
    """Up to three of ``known`` close to ``name``, for an error message (difflib is loaded
    only when a device is not found)."""
    import difflib  # noqa: PLC0415

    return tuple(difflib.get_close_matches(name, known, n=3))
