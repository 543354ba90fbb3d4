"""Settings of ``tranche kubelet-plugin``: parsed once at start, validated, frozen.

Every flag has a ``TRANCHE_*`` environment twin (see :mod:`driver.flags`); the
DaemonSet sets the twins, a developer passes flags.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator

from driver.devices.inventory import AdvertiseConfig, parse_advertise, parse_mig_profiles
from driver.devices.slices import DEFAULT_DRIVER_NAME
from driver.errors import ConfigError
from driver.flags import (
    add_flag,
    add_switch,
    flag_text,
    invalid_setting,
    named,
    number,
    parse_address,
)
from driver.health.policy import HealthPolicy
from driver.json_or_yaml import NotJsonOrYaml, parse_json_or_yaml
from driver.sharing import SharingConfig, parse_sharing
from driver.trust.policy import TrustLevel

# The Node label that opts a node into dynamic MIG (kubelet_plugin/node_labels.py).
DEFAULT_MIG_NODE_LABEL = "gpu.tranche.dev/dynamic-mig"


# Threads serving the DRA socket (``--grpc-workers``). The kubelet's health stream holds one
# for as long as it is open; the others serve prepare and unprepare calls, which queue in gRPC
# beyond that. Claims are prepared one at a time under the node lock and, against a responsive
# API server, a claim read takes about as long as the work under the lock, so five calls in
# flight keep the lock busy; each thread that ran keeps its stack and heap (a 240-claim burst
# left +6.7 MiB with 16, +5.1-5.5 MiB with 6, at the same speed). Where the API server is slow
# and many pods start at once on a node, more threads hide the read latency: raise it.
DRA_WORKERS = 6

NVML = ("real", "simulated")
TRUST_LEVELS = tuple(lv.value for lv in TrustLevel)
LOG_FORMATS = ("text", "json")
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


class PluginSettings(BaseModel):
    """Validated configuration of one kubelet-plugin process."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    node_name: str = Field(min_length=1, max_length=253)
    driver_name: str = Field(default=DEFAULT_DRIVER_NAME, min_length=1, max_length=63)
    kubelet_root_dir: Path = Path("/var/lib/kubelet")
    cdi_root: Path = Path("/var/run/cdi")
    # The host's NVIDIA driver as this process sees it (the chart mounts it at /driver-root):
    # libnvidia-ml.so.1, nvidia-smi and nvidia-cuda-mps-control are taken from there by path,
    # and every claim's CDI spec mounts its libraries and utilities.
    driver_root: Path = Path("/")
    host_driver_root: Path | None = None  # the same on the host (default: driver_root)
    cdi_hook_path: str | None = None  # host path of nvidia-cdi-hook (default: in the root)
    state_dir: Path | None = None  # default: <kubelet-root>/plugins/<driver>
    nvml: Literal["real", "simulated"] = "real"
    # The host's procfs (the chart mounts it read-only at /host/proc): NVML reports GPU
    # processes by host PID, and the usage sampler reads /proc/<pid>/cgroup of other pods'.
    proc_root: Path = Path("/proc")
    profile: str = "dgx-h100"
    sim_state: Path | None = None
    advertise: AdvertiseConfig = AdvertiseConfig()
    mig_profiles: tuple[str, ...] = ()  # dynamic placements of these profiles only; (): all
    # A Node label (qualified name) whose value "true" opts the node into dynamic MIG; "": off.
    mig_node_label: str = Field(
        default=DEFAULT_MIG_NODE_LABEL,
        pattern=r"^(([a-z0-9]([-a-z0-9]*[a-z0-9])?\.)*[a-z0-9]([-a-z0-9]*[a-z0-9])?/)?"
        r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$|^$",
    )
    sharing: SharingConfig = SharingConfig()
    dedicated_to: str | None = Field(default=None, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    kubeconfig: Path | None = None
    metrics_address: str = ":9400"
    health_address: str = ":9401"
    rolling_update_uid: str | None = None
    default_trust_level: TrustLevel = TrustLevel.ISOLATED
    sample_interval_s: float = Field(default=10.0, gt=0, le=3600)
    sweep_interval_s: float = Field(default=60.0, gt=0, le=3600)
    grpc_workers: int = Field(default=DRA_WORKERS, ge=2, le=64)
    health_policy: HealthPolicy = HealthPolicy()
    device_plugin_check: bool = True
    claim_status: bool = True
    log_format: Literal["text", "json"] = "text"
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"

    @field_validator("driver_name")
    @classmethod
    def _dns_subdomain(cls, v: str) -> str:
        if not re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*", v):
            raise ValueError("must be a lowercase DNS subdomain such as gpu.tranche.dev")
        return v

    @field_validator("metrics_address", "health_address")
    @classmethod
    def _address(cls, v: str, info: ValidationInfo) -> str:
        if v:
            parse_address(v, named("--" + str(info.field_name).replace("_", "-")))
        return v

    @property
    def data_dir(self) -> Path:
        """Checkpoint, lock and health state: shared by two plugin pods of one node."""
        if self.state_dir is not None:
            return self.state_dir
        return self.kubelet_root_dir / "plugins" / self.driver_name


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_flag(p, "--node-name", "name of this node (pool name of its ResourceSlices); required")
    add_flag(p, "--driver-name", "DRA driver name", default=DEFAULT_DRIVER_NAME)
    add_flag(p, "--kubelet-root-dir", "kubelet root directory", default="/var/lib/kubelet")
    add_flag(p, "--cdi-root", "directory for CDI spec files", default="/var/run/cdi")
    add_flag(
        p,
        "--driver-root",
        "where this process sees the NVIDIA driver's files (the chart mounts the host's at "
        "/driver-root): libnvidia-ml.so.1, nvidia-smi and nvidia-cuda-mps-control are taken "
        "from there by path, and CDI specs mount its libraries; with --nvml simulated a "
        "simulated driver root is written here (default there: <state-dir>/sim-driver-root)",
        default="/",
    )
    add_flag(
        p,
        "--host-driver-root",
        "the driver root as the host sees it, for CDI host paths (default: --driver-root)",
    )
    add_flag(
        p,
        "--cdi-hook-path",
        "host path of nvidia-cdi-hook for the CDI hooks that make the driver's libraries "
        "loadable (default: found in the driver root; none: libraries mounted by soname)",
    )
    add_flag(
        p,
        "--state-dir",
        "checkpoint and lock directory (default: <kubelet-root-dir>/plugins/<driver-name>)",
    )
    add_flag(
        p,
        "--nvml",
        "GPU library: the real libnvidia-ml or the simulation",
        default="real",
        choices=NVML,
    )
    add_flag(
        p,
        "--proc-root",
        "the host's /proc as mounted in the container: NVML names GPU processes by host PID, "
        "and their pods are found from <proc-root>/<pid>/cgroup",
        default="/proc",
    )
    add_flag(
        p,
        "--profile",
        "simulation: a shipped node profile name or a profile file",
        default="dgx-h100",
    )
    add_flag(
        p,
        "--sim-state",
        "simulation: state file of the simulated GPUs, created from "
        "--profile when missing; lets faults be injected from outside",
    )
    add_flag(
        p,
        "--advertise",
        "device types per GPU, JSON/YAML such as "
        '\'{"*": ["gpu", "mig"]}\' or @FILE (default: gpu and mig-enabled, docs/devices.md)',
        default="",
    )
    add_flag(
        p,
        "--mig-profiles",
        "comma-separated GPU-instance profiles whose dynamic MIG placements are advertised, "
        "e.g. 1g.10gb,3g.40gb,7g.80gb (existing instances always are); empty: every profile",
        default="",
    )
    add_flag(
        p,
        "--mig-node-label",
        "a Node label: where it is 'true', every GPU advertised 'mig-enabled' (the default) "
        "advertises every MIG placement instead (dynamic MIG on this node); read at start "
        "and watched: a change restarts the plugin in place; "
        "empty: never read",
        default=DEFAULT_MIG_NODE_LABEL,
    )
    add_flag(
        p,
        "--dedicated-to",
        "dedicate this node to one tenant (trust level dedicated): every device carries "
        "dedicatedTo=<tenant> and only the dedicated device class selects it (docs/trust.md)",
    )
    add_flag(
        p,
        "--sharing",
        "time-slicing/MPS share devices as JSON/YAML or @FILE: sharing groups, maxShares, "
        "MPS daemon path (see docs/sharing.md; default: no share devices)",
        default="",
    )
    add_flag(
        p,
        "--kubeconfig",
        "kubeconfig file (default: in-cluster service account, else KUBECONFIG or ~/.kube/config)",
    )
    add_flag(
        p,
        "--metrics-address",
        "HOST:PORT of the Prometheus endpoint; empty disables",
        default=":9400",
    )
    add_flag(
        p,
        "--health-address",
        "HOST:PORT of /healthz (liveness through the plugin's own sockets) and /readyz "
        "(registered with the kubelet, slices published); empty disables",
        default=":9401",
    )
    add_flag(
        p,
        "--rolling-update-uid",
        "this pod's UID: serve per-pod sockets so two plugin "
        "pods of one node can overlap during a rolling update",
    )
    add_flag(
        p,
        "--default-trust-level",
        "trust level of namespaces without a trust label (must match the admission policy)",
        default=TrustLevel.ISOLATED.value,
        choices=TRUST_LEVELS,
    )
    add_flag(p, "--sample-interval", "seconds between usage samples", default="10")
    add_flag(
        p,
        "--sweep-interval",
        "seconds between looks for what an unprepare on a lost GPU left (a MIG device, a time "
        "slice, an MPS compute mode): swept once the GPU answers; while sweeps clean nothing, "
        "the looks back off to 16 intervals (see docs/checkpoint.md)",
        default="60",
    )
    add_flag(
        p,
        "--grpc-workers",
        "threads serving the kubelet's DRA calls (one is held by its health stream); "
        "raise it where a slow API server meets many pods starting at once",
        default=str(DRA_WORKERS),
    )
    add_flag(
        p,
        "--health-policy",
        "health policy as JSON/YAML or @FILE: effects per fault class, "
        "quiet and debounce seconds, probe interval (see docs/health.md)",
        default="",
    )
    add_flag(p, "--log-format", "log format", default="text", choices=LOG_FORMATS)
    add_flag(p, "--log-level", "log level", default="INFO", choices=LOG_LEVELS)
    add_switch(
        p,
        "--device-plugin-check",
        "refuse to start while a device plugin advertises nvidia.com/gpu (or a MIG resource) "
        "on this node: both would hand out the same GPUs (default on)",
        default=True,
    )
    add_switch(
        p,
        "--claim-status",
        "write status.devices of each prepared claim: device, mode, limits, a Ready condition "
        "(default on); off, the plugin writes no ResourceClaim",
        default=True,
    )
    add_switch(p, "--dry-run", "validate the configuration and print it, then exit")


def parse_health_policy(value: str) -> HealthPolicy:
    """``--health-policy``: inline JSON/YAML or ``@FILE``; empty means the defaults."""
    text, source = flag_text(value, "--health-policy")
    if not text.strip():
        return HealthPolicy()
    try:
        return HealthPolicy.model_validate(parse_json_or_yaml(text))
    except (ValidationError, NotJsonOrYaml) as e:
        raise ConfigError(f"{source}: {e}") from e


def settings_from_args(args: argparse.Namespace) -> PluginSettings:
    """Validate once; a bad value raises :class:`ConfigError` naming the flag."""
    if not args.node_name:
        raise ConfigError("--node-name (TRANCHE_NODE_NAME) is required")
    try:
        return PluginSettings(
            node_name=args.node_name,
            driver_name=args.driver_name,
            kubelet_root_dir=Path(args.kubelet_root_dir),
            cdi_root=Path(args.cdi_root),
            driver_root=Path(args.driver_root or "/"),
            host_driver_root=Path(args.host_driver_root) if args.host_driver_root else None,
            cdi_hook_path=args.cdi_hook_path or None,
            state_dir=Path(args.state_dir) if args.state_dir else None,
            nvml=args.nvml,
            proc_root=Path(args.proc_root),
            profile=args.profile,
            sim_state=Path(args.sim_state) if args.sim_state else None,
            advertise=parse_advertise(args.advertise),
            mig_node_label=args.mig_node_label,
            mig_profiles=parse_mig_profiles(args.mig_profiles),
            sharing=parse_sharing(args.sharing),
            dedicated_to=args.dedicated_to or None,
            kubeconfig=Path(args.kubeconfig) if args.kubeconfig else None,
            metrics_address=args.metrics_address,
            health_address=args.health_address,
            rolling_update_uid=args.rolling_update_uid or None,
            default_trust_level=TrustLevel(args.default_trust_level),
            sample_interval_s=number(args.sample_interval, "--sample-interval", float),
            sweep_interval_s=number(args.sweep_interval, "--sweep-interval", float),
            grpc_workers=number(args.grpc_workers, "--grpc-workers", int),
            health_policy=parse_health_policy(args.health_policy),
            device_plugin_check=args.device_plugin_check,
            claim_status=args.claim_status,
            log_format=args.log_format,
            log_level=args.log_level,
        )
    except ValidationError as e:
        raise invalid_setting(e, args) from e
    except ValueError as e:
        raise ConfigError(f"invalid setting: {e}") from e
