"""Per-claim CDI spec files.

One transient spec per claim, ``<cdi dir>/gpu.tranche.dev-claim_<claim uid>.json``,
kind ``gpu.tranche.dev/claim``, one CDI device per allocated device named
``<claim uid>-<device>[-<share id>]``. The container runtime resolves the IDs
``gpu.tranche.dev/claim=<name>`` the plugin returns to the kubelet. The spec
declares the lowest ``cdiVersion`` its fields need, so older runtimes accept it.

Device nodes are named by path. On a real node the runtime stats each path on the host
and copies its type and numbers. A simulated node has no ``/dev/nvidia*``, so there the
spec also carries ``type: c`` with the NVIDIA majors and minors (:class:`DeviceNumbers`):
the runtime creates the node in the container from the numbers alone (containerd would
otherwise fail the container with "failed to stat CDI host device").
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from driver.api import ClaimRef
from driver.faults import NO_FAULTS, FaultPoints
from driver.files import write_atomic
from driver.prepare.plan import PlannedDevice

log = logging.getLogger(__name__)

VENDOR = "gpu.tranche.dev"
CLASS = "claim"
KIND = f"{VENDOR}/{CLASS}"
DEFAULT_CDI_DIR = Path("/var/run/cdi")
CONTROL_NODES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")
_SPEC_FILE = re.compile(rf"^{re.escape(VENDOR)}-{CLASS}_(?P<uid>[A-Za-z0-9-]+)\.json$")
_NAME_OK = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9_.:-]*[A-Za-z0-9])?$")
NVIDIA_MAJOR = 195  # nvidia-frontend: /dev/nvidia<N> is 195:N, /dev/nvidiactl 195:255
_GPU_NODE = re.compile(r"^/dev/nvidia(?P<minor>\d+)$")
_CAP_NODE = re.compile(r"^/dev/nvidia-caps/nvidia-cap(?P<minor>\d+)$")


@dataclass(frozen=True)
class DeviceNumbers:
    """Character-device numbers of the NVIDIA device nodes, for nodes the host lacks.

    The fixed ones are the driver's (``nvidia-frontend`` 195: ``nvidia<N>`` is minor N,
    ``nvidiactl`` 255, ``nvidia-modeset`` 254); ``nvidia-uvm`` (minor 0, ``-tools`` 1)
    and ``nvidia-caps`` take a major the kernel assigns, read from ``/proc/devices``.
    """

    uvm_major: int | None = None
    caps_major: int | None = None

    @classmethod
    def from_proc_devices(cls, text: str) -> DeviceNumbers:
        """Majors from a ``/proc/devices`` listing (``510 nvidia-uvm``)."""
        majors: dict[str, int] = {}
        for line in text.splitlines():
            parts = line.split()
            if len(parts) == 2 and parts[0].isdigit():
                majors.setdefault(parts[1], int(parts[0]))
        return cls(uvm_major=majors.get("nvidia-uvm"), caps_major=majors.get("nvidia-caps"))

    def lookup(self, path: str) -> tuple[int, int] | None:
        """``(major, minor)`` of a device node path; None for a node these do not describe."""
        fixed = {"/dev/nvidiactl": (NVIDIA_MAJOR, 255), "/dev/nvidia-modeset": (NVIDIA_MAJOR, 254)}
        if path in fixed:
            return fixed[path]
        if m := _GPU_NODE.match(path):
            return NVIDIA_MAJOR, int(m.group("minor"))
        if self.uvm_major is not None and path in ("/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"):
            return self.uvm_major, 0 if path == "/dev/nvidia-uvm" else 1
        if self.caps_major is not None and (m := _CAP_NODE.match(path)):
            return self.caps_major, int(m.group("minor"))
        return None

    def node(self, path: str) -> dict[str, Any]:
        """The CDI ``deviceNodes`` entry of ``path``: with numbers when these know them."""
        numbers = self.lookup(path)
        if numbers is None:
            return {"path": path}
        return {"path": path, "type": "c", "major": numbers[0], "minor": numbers[1]}


@dataclass(frozen=True)
class Mount:
    host_path: str
    container_path: str
    options: tuple[str, ...] = ()
    type: str = ""


@dataclass(frozen=True)
class Hook:
    """An OCI hook the runtime runs for the container (CDI ``hooks[]``); ``path`` on the host."""

    hook_name: str
    path: str
    args: tuple[str, ...] = ()
    env: tuple[str, ...] = ()


@dataclass(frozen=True)
class ContainerEdits:
    env: tuple[str, ...] = ()
    device_nodes: tuple[str, ...] = ()
    mounts: tuple[Mount, ...] = ()
    hooks: tuple[Hook, ...] = ()

    def __add__(self, other: ContainerEdits) -> ContainerEdits:
        return ContainerEdits(
            env=self.env + other.env,
            device_nodes=self.device_nodes
            + tuple(n for n in other.device_nodes if n not in self.device_nodes),
            mounts=self.mounts + other.mounts,
            hooks=self.hooks + other.hooks,
        )

    def to_json(self, numbers: DeviceNumbers | None = None) -> dict[str, Any]:
        """CDI ``containerEdits``; device nodes with ``numbers`` when given (simulated nodes)."""
        out: dict[str, Any] = {}
        if self.env:
            out["env"] = list(self.env)
        if self.device_nodes:
            out["deviceNodes"] = [
                numbers.node(p) if numbers else {"path": p} for p in self.device_nodes
            ]
        if self.mounts:
            out["mounts"] = [
                {"hostPath": m.host_path, "containerPath": m.container_path}
                | ({"options": list(m.options)} if m.options else {})
                | ({"type": m.type} if m.type else {})
                for m in self.mounts
            ]
        if self.hooks:
            out["hooks"] = [
                {"hookName": h.hook_name, "path": h.path}
                | ({"args": list(h.args)} if h.args else {})
                | ({"env": list(h.env)} if h.env else {})
                for h in self.hooks
            ]
        return out


@dataclass(frozen=True)
class CdiDevice:
    name: str
    edits: ContainerEdits = field(default_factory=ContainerEdits)


def device_name(claim_uid: str, device: str, share_id: str | None = None) -> str:
    """The CDI device name of one claim device; unique per claim, device and share."""
    name = f"{claim_uid}-{device}" + (f"-{share_id}" if share_id else "")
    if not _NAME_OK.match(name):
        raise ValueError(f"CDI device name {name!r} is not valid")
    return name


def device_id(name: str) -> str:
    """The fully-qualified CDI device ID the kubelet passes to the runtime."""
    return f"{KIND}={name}"


def minimum_version(spec: Mapping[str, Any]) -> str:
    """The lowest ``cdiVersion`` that allows every field the spec uses (CDI ``version.go``)."""
    devices = spec.get("devices", [])
    edits = [d.get("containerEdits", {}) for d in devices] + [spec.get("containerEdits", {})]
    vendor_class = str(spec.get("kind", "")).split("/", 1)
    if (
        spec.get("annotations")
        or any(d.get("annotations") for d in devices)
        or (len(vendor_class) == 2 and "." in vendor_class[1])
    ):
        return "0.6.0"
    if any(not str(d.get("name", "a"))[:1].isalpha() for d in devices) or any(
        n.get("hostPath") for e in edits for n in e.get("deviceNodes", [])
    ):
        return "0.5.0"
    if any(m.get("type") for e in edits for m in e.get("mounts", [])):
        return "0.4.0"
    return "0.3.0"


def claim_devices(
    ref: ClaimRef,
    devices: Sequence[PlannedDevice],
    uuids: Mapping[str, str],
    extra: Mapping[str, ContainerEdits] | None = None,
) -> list[CdiDevice]:
    """The CDI devices of a claim: device node, ``NVIDIA_VISIBLE_DEVICES`` by UUID, extras.

    ``uuids`` maps device names to the UUID a container sees (the GPU's, or the
    MIG device's). A container gets the devices of one request (or of all), so
    ``NVIDIA_VISIBLE_DEVICES`` lists the UUIDs of every device of the same request.
    """
    extra = extra or {}
    by_request: dict[str, list[str]] = {}
    for d in devices:
        by_request.setdefault(d.base_request, []).append(uuids[d.device])
    out = []
    for d in devices:
        edits = ContainerEdits(
            env=(f"NVIDIA_VISIBLE_DEVICES={','.join(by_request[d.base_request])}",),
            device_nodes=(f"/dev/nvidia{d.minor}",),
        ) + extra.get(d.device, ContainerEdits())
        out.append(CdiDevice(device_name(ref.uid, d.device, d.share_id), edits))
    return out


def claim_edits(ref: ClaimRef) -> ContainerEdits:
    """Edits every container of the claim gets: control device nodes and claim identity."""
    return ContainerEdits(
        env=(
            f"TRANCHE_CLAIM_UID={ref.uid}",
            f"TRANCHE_CLAIM_NAMESPACE={ref.namespace}",
            f"TRANCHE_CLAIM_NAME={ref.name}",
        ),
        device_nodes=CONTROL_NODES,
    )


def build_spec(
    devices: Sequence[CdiDevice], common: ContainerEdits, numbers: DeviceNumbers | None = None
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "kind": KIND,
        "devices": [{"name": d.name, "containerEdits": d.edits.to_json(numbers)} for d in devices],
        "containerEdits": common.to_json(numbers),
    }
    return {"cdiVersion": minimum_version(spec)} | spec


class CdiSpecs:
    """The claim spec files in one CDI directory.

    ``numbers`` describe device nodes by type and numbers (a simulated node, whose host
    has no NVIDIA device nodes); None names them by path only (a real node).
    ``node_edits`` are the node's driver edits (:mod:`driver.prepare.driver_root`: libraries,
    utilities, IPC sockets, control device nodes, hooks), found once at start and written
    into the spec-wide ``containerEdits`` of every claim's spec.
    """

    def __init__(
        self,
        cdi_dir: Path = DEFAULT_CDI_DIR,
        faults: FaultPoints = NO_FAULTS,
        numbers: DeviceNumbers | None = None,
        node_edits: ContainerEdits | None = None,
    ) -> None:
        self.dir = cdi_dir
        self._faults = faults
        self._numbers = numbers
        self._node_edits = node_edits or ContainerEdits()

    def path(self, claim_uid: str) -> Path:
        return self.dir / f"{VENDOR}-{CLASS}_{claim_uid}.json"

    def write(self, claim_uid: str, devices: Sequence[CdiDevice], common: ContainerEdits) -> Path:
        path = self.path(claim_uid)
        spec = build_spec(devices, common + self._node_edits, self._numbers)
        # Compact: ``indent`` switches json to its pure-Python encoder (about 0.1 ms a spec).
        data = json.dumps(spec, separators=(",", ":")).encode() + b"\n"
        # Not fsynced: the spec is whole for the runtime at once (page cache), and after a
        # machine crash start-up recovery rewrites the spec of every prepared claim (its
        # directory is a tmpfs on most nodes anyway).
        write_atomic(
            path, data, fault_point="cdi:before-replace", faults=self._faults, durable=False
        )
        return path

    def remove(self, claim_uid: str) -> bool:
        # A temporary a killed process left is swept at start-up (:meth:`sweep`, under the
        # node lock), not here: listing the directory at every unprepare cost time in
        # proportion to the claims on the node.
        path = self.path(claim_uid)
        try:
            path.unlink()
        except FileNotFoundError:
            return False
        return True

    def claim_uids(self) -> set[str]:
        """UIDs of the claims that have a spec file here."""
        if not self.dir.is_dir():
            return set()
        found = set()
        for p in self.dir.iterdir():
            m = _SPEC_FILE.match(p.name)
            if m:
                found.add(m.group("uid"))
        return found

    def sweep(self, keep: Iterable[str]) -> list[str]:
        """Delete spec files (and half-written temporaries) of claims not in ``keep``."""
        keep = set(keep)
        removed = []
        for uid in sorted(self.claim_uids() - keep):
            self.remove(uid)
            removed.append(uid)
            log.info("removed orphaned CDI spec claim_uid=%s", uid)
        if self.dir.is_dir():
            for tmp in self.dir.glob(f".{VENDOR}-{CLASS}_*.tmp"):
                tmp.unlink(missing_ok=True)
        return removed


def mig_caps_minors(mig_minors_file: Path, gpu_minor: int, gi: int, ci: int) -> tuple[int, int]:
    """The nvidia-caps minors for a MIG device's GPU-instance and compute-instance access.

    ``/proc/driver/nvidia-caps/mig-minors`` lines read ``gpu<M>/gi<G>/access <minor>``
    and ``gpu<M>/gi<G>/ci<C>/access <minor>``; the container needs
    ``/dev/nvidia-caps/nvidia-cap<minor>`` for both.
    """
    table: dict[str, int] = {}
    for line in mig_minors_file.read_text().splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].isdigit():
            table[parts[0]] = int(parts[1])
    gi_key = f"gpu{gpu_minor}/gi{gi}/access"
    ci_key = f"gpu{gpu_minor}/gi{gi}/ci{ci}/access"
    missing = [k for k in (gi_key, ci_key) if k not in table]
    if missing:
        raise FileNotFoundError(f"{mig_minors_file}: no entry for {', '.join(missing)}")
    return table[gi_key], table[ci_key]
