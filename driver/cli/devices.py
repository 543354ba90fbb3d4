"""``tranche devices``: the node's devices as the scheduler will see them.

Reads the GPUs from NVML (real or simulated), builds the inventory and the
ResourceSlices exactly as the kubelet plugin does, and prints them; it does not
talk to the cluster. ``--cluster`` instead lists every device of the cluster
through the controller's ``cluster-devices`` command.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import pynvml
import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

from driver.cli import Command, load_commands
from driver.devices.inventory import (
    AdvertiseConfig,
    GpuDevice,
    Inventory,
    build_inventory,
    parse_advertise,
    parse_mig_profiles,
)
from driver.devices.slices import DEFAULT_DRIVER_NAME, build_slices
from driver.errors import TrancheError
from driver.flags import add_flag, add_switch
from driver.health.monitor import HealthMonitor, device_gpu_map
from driver.health.policy import HealthPolicy
from driver.health.store import HealthStateFile
from driver.nvml.driver_root import DriverRoot, load_nvml
from driver.nvml.facade import Nvml
from driver.nvml.host import NvidiaSmiTimeslice
from driver.nvml.sim import create_state, open_simulated

GIB = 2**30
NVML = ("real", "simulated")
OUTPUTS = ("table", "yaml", "json")


class DevicesSettings(BaseModel):
    """Validated settings of ``tranche devices``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    nvml: Literal["real", "simulated"]
    driver_root: Path
    profile: str
    sim_state: Path | None
    node_name: str
    driver_name: str
    advertise: AdvertiseConfig
    mig_profiles: tuple[str, ...] = ()
    health_state: Path | None
    output: Literal["table", "yaml", "json"]


def _add_arguments(p: argparse.ArgumentParser) -> None:
    add_flag(p, "--nvml", "GPU library: the real libnvidia-ml or the simulation",
             default="real", choices=NVML)  # fmt: skip
    add_flag(p, "--driver-root", "directory of the NVIDIA driver: libnvidia-ml.so.1 is "
             "loaded from its lib directories by path", default="/")  # fmt: skip
    add_flag(p, "--profile", "simulation profile: a shipped name or a JSON file",
             default="dgx-h100")  # fmt: skip
    add_flag(p, "--sim-state", "simulation state file (from `tranche sim init`); "
             "overrides --profile")  # fmt: skip
    add_flag(p, "--node-name", "node name (pool name of the slices)", default=socket.gethostname())
    add_flag(p, "--driver-name", "DRA driver name", default=DEFAULT_DRIVER_NAME)
    add_flag(p, "--advertise", "device types per GPU: JSON/YAML like "
             "'{\"*\": [\"gpu\", \"mig\"]}' or @FILE", default="")  # fmt: skip
    add_flag(p, "--mig-profiles", "comma-separated GPU-instance profiles whose dynamic "
             "MIG placements are shown (as the plugin's flag); empty: every profile",
             default="")  # fmt: skip
    add_flag(p, "--health-state", "the plugin's health state file, to show its taints")
    add_switch(
        p,
        "--cluster",
        "list every device of the cluster (from its ResourceSlices and "
        "DeviceTaintRules) with taints, health and the claims that hold it",
    )
    add_switch(
        p,
        "--free",
        "with --cluster: per node the free whole GPUs, the largest free NVLink domain and the "
        "free MIG placements, and how many 1-, 2-, 4-, 8-GPU claims fit now",
    )
    add_flag(
        p,
        "--kubeconfig",
        "with --cluster: kubeconfig file (default: KUBECONFIG, in-cluster, ~/.kube/config)",
        default=os.environ.get("KUBECONFIG"),
    )
    add_flag(p, "--output", "table of devices, or the ResourceSlices as YAML or JSON",
             default="table", choices=OUTPUTS)  # fmt: skip


def _settings(args: argparse.Namespace) -> DevicesSettings:
    try:
        return DevicesSettings(
            nvml=args.nvml,
            driver_root=Path(args.driver_root),
            profile=args.profile,
            sim_state=Path(args.sim_state) if args.sim_state else None,
            node_name=args.node_name,
            driver_name=args.driver_name,
            advertise=parse_advertise(args.advertise),
            mig_profiles=parse_mig_profiles(args.mig_profiles),
            health_state=Path(args.health_state) if args.health_state else None,
            output=args.output,
        )
    except ValidationError as e:
        raise TrancheError(f"tranche devices: {e}") from e


def _open(settings: DevicesSettings) -> Nvml:
    if settings.nvml == "real":
        root = DriverRoot(settings.driver_root)
        load_nvml(root, pynvml)
        nvml = Nvml(pynvml, timeslice=NvidiaSmiTimeslice(root.binary("nvidia-smi")))
        nvml.init()
        return nvml
    if settings.sim_state is not None:
        if not settings.sim_state.is_file():
            raise TrancheError(f"--sim-state {settings.sim_state}: no such file")
        return open_simulated(settings.sim_state)
    return open_simulated(create_state(settings.profile, node=settings.node_name))


def _taints(settings: DevicesSettings, inventory: Inventory) -> dict[str, list[dict[str, str]]]:
    if settings.health_state is None:
        return {}
    if not settings.health_state.is_file():
        raise TrancheError(f"--health-state {settings.health_state}: no such file")
    monitor = HealthMonitor(
        HealthPolicy(), settings.node_name, store=HealthStateFile(settings.health_state)
    )
    devices = device_gpu_map(inventory)
    monitor.set_devices(devices)
    return {k: v for k, v in monitor.taints_by_device(devices).items() if v}


def _memory(n: int) -> str:
    return f"{n / GIB:.1f}Gi"


def device_rows(
    inventory: Inventory, taints: Mapping[str, Sequence[Mapping[str, Any]]]
) -> list[list[str]]:
    """One row per advertised device: name, type, product, memory, profile, parent, taints."""
    rows = []
    for d in inventory.devices():
        t = ",".join(
            f"{x['key']}{'=' + x['value'] if x.get('value') else ''}:{x['effect']}"
            for x in taints.get(d.name, ())
        )
        if isinstance(d, GpuDevice):
            info = d.info
            rows.append([d.name, "gpu", info.product_name, _memory(info.memory_bytes), "", "",
                         t or "-"])  # fmt: skip
        else:
            kind = "mig (static)" if d.static else "mig"
            rows.append([d.name, kind, d.parent.product_name, _memory(d.profile.memory_bytes),
                         d.profile.name, d.parent_name, t or "-"])  # fmt: skip
    return rows


def format_table(rows: list[list[str]]) -> str:
    header = ["NAME", "TYPE", "PRODUCT", "MEMORY", "PROFILE", "PARENT", "TAINTS"]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in [header, *rows]
    )


def _run_cluster(args: argparse.Namespace) -> int:
    """``--cluster``: every device of the cluster, through the controller's command."""
    if args.output == "yaml":
        print("tranche devices --cluster: --output is table or json", file=sys.stderr)
        return 2
    cluster = load_commands().get("cluster-devices")
    if cluster is None:
        print("tranche devices --cluster: the controller package is not installed", file=sys.stderr)
        return 1
    parser = argparse.ArgumentParser(prog="tranche devices --cluster")
    cluster.add_arguments(parser)
    argv = ["--driver-name", args.driver_name, "--output", args.output]
    if args.free:
        argv.append("--free")
    if args.kubeconfig:
        argv += ["--kubeconfig", args.kubeconfig]
    return cluster.run(parser.parse_args(argv))


def run(args: argparse.Namespace) -> int:
    if args.cluster:
        return _run_cluster(args)
    if args.free:
        print("tranche devices: --free needs --cluster", file=sys.stderr)
        return 2
    try:
        settings = _settings(args)
        nvml = _open(settings)
        try:
            inventory = build_inventory(
                nvml.list_gpus(),
                nvml.system_info(),
                settings.advertise,
                mig_profiles=settings.mig_profiles,
            )
        finally:
            nvml.shutdown()
        taints = _taints(settings, inventory)
        slices = build_slices(inventory, settings.node_name, settings.driver_name, taints=taints)
    except TrancheError as e:
        print(f"tranche devices: {e}", file=sys.stderr)
        return 1
    if settings.output == "yaml":
        print(yaml.safe_dump_all(slices, sort_keys=False), end="")
    elif settings.output == "json":
        print(json.dumps({"apiVersion": "v1", "kind": "List", "items": slices}, indent=2))
    else:
        print(format_table(device_rows(inventory, taints)))
    for note in inventory.notes:
        print(f"note: {note}", file=sys.stderr)
    return 0


devices_command = Command(
    help="Print this node's GPUs and MIG slots as the scheduler will see them "
    "(or the ResourceSlices, with --output yaml) without contacting the cluster; with "
    "--cluster, every device of the cluster with its taints, health and claims.",
    add_arguments=_add_arguments,
    run=run,
)
