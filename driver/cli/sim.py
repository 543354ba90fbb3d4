"""``tranche sim``: create and drive simulated GPUs (a state file a plugin reads).

::

    tranche sim init --profile dgx-h100 --state /var/run/tranche/sim.json
    tranche sim show --state ...
    tranche sim inject-xid --state ... --gpu 0 --xid 48 --recovery-action gpu-reset
    tranche sim lose-gpu --state ... --gpu GPU-...
    tranche sim recover --state ... --gpu GPU-...
    tranche sim fail-mig-create --state ... --gpu 0 --error INSUFFICIENT_RESOURCES
    tranche sim fail-mig-create --state ... --gpu 0 --clear
    tranche sim add-process --state ... --device GPU-...|MIG-... --pid 4242 --memory-mib 2048 \\
        --sm-util 35 --cgroup "0::/kubepods.slice/.../cri-containerd-<id>.scope"
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from driver.cli import Command
from driver.errors import TrancheError
from driver.flags import add_flag, env_name
from driver.nvml.sim import create_state
from driver.nvml.sim.calls import mig_uuid
from driver.nvml.sim.control import NVML_ERRORS, SimControl
from driver.nvml.sim.profiles import shipped_profiles
from driver.nvml.sim.state import SimState, SimStore

MIB = 1 << 20


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="sim_action", required=True, metavar="ACTION")

    def action(name: str, help: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help, description=help)
        add_flag(p, "--state", "simulated GPU state file (JSON)", default=None)
        return p

    p = action("init", "create a state file from a node profile (overwrites it)")
    p.add_argument(
        "--profile",
        required=True,
        help=f"a shipped profile ({', '.join(shipped_profiles())}) or a profile file path",
    )
    add_flag(
        p,
        "--node-name",
        "the node the GPUs belong to: their UUIDs are derived from it (unique per node); "
        "empty: from the profile alone",
        default="",
    )
    action("show", "print the simulated GPUs, MIG devices and processes as JSON")
    p = action("inject-xid", "raise an XID critical-error event on a GPU")
    p.add_argument(
        "--gpu",
        required=True,
        help="GPU index or UUID, or a MIG UUID: the event then names its GPU and compute instance",
    )
    p.add_argument("--xid", required=True, type=int, help="the XID number, e.g. 48")
    p.add_argument("--recovery-action", help="NVML recovery action: none, gpu-reset, ...")
    p.add_argument(
        "--gi", type=int, help="attribute the event to this MIG GPU instance id (default: --gpu's)"
    )
    p.add_argument("--ci", type=int, help="and this compute instance id")
    p = action("inject-ecc", "raise an ECC error event on a GPU")
    p.add_argument("--gpu", required=True, help="GPU index or UUID")
    p.add_argument("--double-bit", action="store_true", help="double-bit (default single-bit)")
    p = action("lose-gpu", "the GPU falls off the bus (XID 79, then GPU_IS_LOST)")
    p.add_argument("--gpu", required=True, help="GPU index or UUID")
    p = action("recover", "reset the GPU: back on the bus, MIG instances and processes gone")
    p.add_argument("--gpu", required=True, help="GPU index or UUID")
    p = action(
        "fail-mig-create",
        "make every MIG GPU-instance create on a GPU fail with an NVML error, until --clear",
    )
    p.add_argument("--gpu", required=True, help="GPU index or UUID (or a MIG UUID)")
    how = p.add_mutually_exclusive_group()
    how.add_argument(
        "--error",
        default="INSUFFICIENT_RESOURCES",
        help="the NVML error, its name after NVML_ERROR_ (default INSUFFICIENT_RESOURCES)",
    )
    how.add_argument("--clear", action="store_true", help="let creates on the GPU succeed again")
    p = action("add-process", "start a process on a GPU or MIG device")
    p.add_argument("--device", required=True, help="GPU or MIG UUID")
    p.add_argument("--pid", required=True, type=int)
    p.add_argument("--memory-mib", type=int, default=0, help="device memory used, MiB")
    p.add_argument("--sm-util", type=int, default=0, help="SM utilisation, percent")
    p.add_argument("--cgroup", default="", help="/proc/<pid>/cgroup content")
    p = action("remove-process", "end a process")
    p.add_argument("--pid", required=True, type=int)
    p = action("set-util", "fix a GPU's reported utilisation")
    p.add_argument("--gpu", required=True, help="GPU index or UUID")
    p.add_argument("--percent", type=int, help="GPU utilisation; omit to derive from processes")


def _summary(state: SimState) -> dict[str, Any]:
    return {
        "profile": state.profile,
        "driver_version": state.driver_version,
        "gpus": [
            {
                "index": g.index,
                "uuid": g.uuid,
                "product_name": g.model.product_name,
                "pci_bus_id": g.slot.pci_bus_id,
                "lost": g.lost,
                "mig_mode": {"current": g.mig_current, "pending": g.mig_pending},
                "compute_mode": g.compute_mode,
                "timeslice": g.timeslice,
                "mig_create_error": NVML_ERRORS.get(g.mig_create_error),
                "mig_devices": [
                    {
                        "uuid": mig_uuid(g, i) if i.ci_id is not None else None,
                        "gi_id": i.gi_id,
                        "ci_id": i.ci_id,
                        "profile_id": i.profile_id,
                        "placement": [i.start, i.size],
                    }
                    for i in g.instances
                ],
                "processes": [p.model_dump() for p in g.processes],
            }
            for g in state.gpus
        ],
        "pending_events": len(state.events),
    }


def _run(args: argparse.Namespace) -> int:
    if not args.state:
        print(f"tranche sim: --state (or {env_name('--state')}) is required", file=sys.stderr)
        return 2
    path = Path(args.state)
    try:
        if args.sim_action == "init":
            store = create_state(args.profile, path, node=args.node_name or None)
            count = store.read(lambda s: len(s.gpus))
            print(f"simulated node {args.profile}: {count} GPUs in {path}")
            return 0
        store = SimStore(path=path)
        control = SimControl(store)
        match args.sim_action:
            case "show":
                print(json.dumps(store.read(_summary), indent=2))
            case "inject-xid":
                control.inject_xid(
                    args.gpu,
                    args.xid,
                    recovery_action=args.recovery_action,
                    gi_id=args.gi,
                    ci_id=args.ci,
                )
            case "inject-ecc":
                control.inject_ecc(args.gpu, double_bit=args.double_bit)
            case "lose-gpu":
                control.lose_gpu(args.gpu)
            case "recover":
                control.recover(args.gpu)
            case "fail-mig-create":
                control.fail_mig_create(args.gpu, None if args.clear else args.error)
            case "add-process":
                control.add_process(
                    args.device,
                    args.pid,
                    used_memory_bytes=args.memory_mib * MIB,
                    sm_util=args.sm_util,
                    cgroup=args.cgroup,
                )
            case "remove-process":
                if not control.remove_process(args.pid):
                    print(f"tranche sim: no simulated process {args.pid}", file=sys.stderr)
                    return 1
            case "set-util":
                control.set_utilization(args.gpu, gpu_percent=args.percent)
    except (TrancheError, ValueError) as e:
        print(f"tranche sim {args.sim_action}: {e}", file=sys.stderr)
        return 1
    return 0


sim_command = Command(
    help="Create and drive simulated GPUs (a state file shared with a running plugin).",
    add_arguments=_add_arguments,
    run=_run,
)
