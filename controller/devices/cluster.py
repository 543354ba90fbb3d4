"""``tranche cluster-devices``: every device of the driver in the cluster.

``--free`` shows what is free instead (``tranche explain free``).

One row per published device: node, name, type, UUID, health (from the
driver's own taints in the ResourceSlice), every taint that applies (slice
taints and DeviceTaintRules, the rule named), and the claims allocated it.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping
from dataclasses import asdict, dataclass

from controller.devices.lookup import DEFAULT_DRIVER, ClusterDevice, ClusterView, read_view
from controller.kube_client import Json, add_kubeconfig_flag
from driver.checkpoint.holds import TAINT_KEY as HELD_KEY
from driver.cli import Command, load_commands
from driver.errors import TrancheError
from driver.flags import add_flag, add_switch
from driver.kube.client import api_client
from driver.kube.http import undecodable

HEALTH_PREFIX = "gpu.tranche.dev/"
ADMIN_KEY = "gpu.tranche.dev/admin"

OUTPUTS = ("table", "json")


@dataclass(frozen=True)
class DeviceRow:
    node: str
    device: str
    type: str
    uuid: str
    health: str
    taints: tuple[str, ...]
    claims: tuple[str, ...]


def health_of(device: ClusterDevice) -> str:
    """Unhealthy when the driver tainted the device NoSchedule/NoExecute for a fault; Held
    when its only such taint is the node's checkpoint hold (not a fault of the device: its
    node refuses new claims until a held claim is unprepared); Healthy otherwise."""
    held = False
    for t in device.taints:
        key = str(t.get("key", ""))
        if not key.startswith(HEALTH_PREFIX) or key == ADMIN_KEY:
            continue
        if t.get("effect") not in ("NoSchedule", "NoExecute"):
            continue
        if key != HELD_KEY:
            return "Unhealthy"
        held = True
    return "Held" if held else "Healthy"


def _taint_text(taint: Json, source: str | None = None) -> str:
    value = f"={taint['value']}" if taint.get("value") else ""
    where = f" [rule {source}]" if source else ""
    return f"{taint.get('key')}{value}:{taint.get('effect')}{where}"


def rows(view: ClusterView) -> list[DeviceRow]:
    out = []
    for d in view.devices:
        taints = [_taint_text(t) for t in d.taints]
        taints += [
            _taint_text(r["spec"]["taint"], r["metadata"]["name"]) for r in view.rules_for(d)
        ]
        out.append(
            DeviceRow(
                d.node, d.name, d.type, d.uuid, health_of(d), tuple(taints), tuple(view.holders(d))
            )
        )
    return out


def render_table(table: list[DeviceRow]) -> str:
    header = ("NODE", "DEVICE", "TYPE", "UUID", "HEALTH", "TAINTS", "CLAIMS")
    cells = [header] + [
        (
            r.node,
            r.device,
            r.type,
            r.uuid or "-",
            r.health,
            ",".join(r.taints) or "-",
            ",".join(r.claims) or "-",
        )
        for r in table
    ]
    widths = [max(len(c[i]) for c in cells) for i in range(len(header))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells
    )


def add_arguments(parser: argparse.ArgumentParser, env: Mapping[str, str] | None = None) -> None:
    add_flag(
        parser, "--driver-name", "DRA driver name of the devices", default=DEFAULT_DRIVER, env=env
    )
    add_flag(parser, "--output", "table or json", default="table", choices=OUTPUTS, env=env)
    add_flag(parser, "--node", "only this node's devices", env=env)
    add_switch(
        parser,
        "--free",
        "per node: free whole GPUs, the largest free NVLink domain, free MIG placements "
        "(the same as `tranche explain free`)",
        env=env,
    )
    add_kubeconfig_flag(parser, env)


def _run_free(args: argparse.Namespace) -> int:
    """``--free``: the explain package's view, found through the command entry points (a
    sibling package, so not imported)."""
    explain = load_commands().get("explain")
    if explain is None:
        print(
            "tranche cluster-devices --free: the explain command is not installed", file=sys.stderr
        )
        return 1
    parser = argparse.ArgumentParser(prog="tranche cluster-devices --free")
    explain.add_arguments(parser)
    argv = ["free", "--driver-name", args.driver_name]
    argv += ["--output", "json" if args.output == "json" else "text"]
    argv += ["--node", args.node] if args.node else []
    argv += ["--kubeconfig", args.kubeconfig] if args.kubeconfig else []
    return explain.run(parser.parse_args(argv))


def run(args: argparse.Namespace) -> int:
    if args.free:
        return _run_free(args)
    try:
        view = read_view(api_client(args.kubeconfig), args.driver_name, with_claims=True)
    except TrancheError as e:
        print(f"tranche cluster-devices: {e}", file=sys.stderr)
        return 1
    for claim in view.claims:
        note = undecodable(claim)
        if note is not None:  # its allocation was read; only the cut value is missing
            print(f"tranche cluster-devices: {note}", file=sys.stderr)
    table = [r for r in rows(view) if args.node is None or r.node == args.node]
    if args.output == "json":
        print(json.dumps([asdict(r) for r in table], indent=2))
    else:
        print(render_table(table))
    return 0


command = Command(
    help="List every GPU device in the cluster with taints, health and the claims holding it.",
    add_arguments=add_arguments,
    run=run,
)
