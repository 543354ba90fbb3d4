"""Configuration of a dev cluster and the layout of its state directory."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, field_validator

# Every DRA feature of Kubernetes 1.37 that Tranche uses, switched on explicitly
# (all of them default to on in v1.37.2; the locked GA ones accept only true).
# Checked against pkg/features/kube_features.go of k8s.io/kubernetes@v1.37.2.
DRA_FEATURE_GATES: dict[str, bool] = {
    "DynamicResourceAllocation": True,  # GA, locked
    "DRAAdminAccess": True,  # GA, locked
    "DRAPrioritizedList": True,  # GA, locked
    "DRAExtendedResource": True,  # GA, locked: extended resources backed by DRA
    "DRAResourceClaimDeviceStatus": True,  # GA, locked
    "DRADeviceTaints": True,  # GA
    "DRADeviceTaintRules": True,  # GA: DeviceTaintRule in resource.k8s.io/v1
    "DRAPartitionableDevices": True,  # beta
    "DRAConsumableCapacity": True,  # beta
    "DRADeviceBindingConditions": True,  # beta
    "ResourceHealthStatus": True,  # beta
    "ResourceHealthStatusMessage": True,  # beta
}

# The version matrix: the gates and API versions each release needs for every DRA feature
# Tranche uses. A gate that a release does not know is never passed (the components would
# refuse to start). Checked against pkg/features/kube_features.go and
# pkg/registry/resource/rest/storage_resource.go of each k8s.io/kubernetes module.
DEFAULT_K8S_VERSION = "1.37"
K8S_VERSIONS: dict[str, str] = {  # minor -> the release hack/build-k8s.sh builds
    "1.34": "v1.34.4",
    "1.35": "v1.35.4",
    "1.36": "v1.36.3",
    "1.37": "v1.37.2",
}
_GATES_134 = {
    "DynamicResourceAllocation": True,  # GA
    "DRAAdminAccess": True,  # beta
    "DRAPrioritizedList": True,  # beta
    "DRAExtendedResource": True,  # alpha
    "DRAResourceClaimDeviceStatus": True,  # beta
    "DRADeviceTaints": True,  # alpha; also guards DeviceTaintRule (v1alpha3) in 1.34
    "DRAPartitionableDevices": True,  # alpha: counters in the devices' own slice
    "DRAConsumableCapacity": True,  # alpha
    "DRADeviceBindingConditions": True,  # alpha
    "ResourceHealthStatus": True,  # alpha
}
_GATES_135 = {**_GATES_134, "DRADeviceTaintRules": True}  # alpha; counters in separate slices
_GATES_136 = {**_GATES_135, "ResourceHealthStatusMessage": True}  # DRADeviceTaintRules beta, off
VERSION_GATES: dict[str, dict[str, bool]] = {
    "1.34": _GATES_134,
    "1.35": _GATES_135,
    "1.36": _GATES_136,
    "1.37": DRA_FEATURE_GATES,
}
# --runtime-config: DeviceTaintRule is served only by an API version that is off by default
# before 1.37 (v1alpha3 in 1.34/1.35; v1beta2, and still v1alpha3, in 1.36).
VERSION_RUNTIME_CONFIG: dict[str, str] = {
    "1.34": "resource.k8s.io/v1alpha3=true",
    "1.35": "resource.k8s.io/v1alpha3=true",
    "1.36": "resource.k8s.io/v1beta2=true",
    "1.37": "",
}

# API versions a gate needs to do anything, added to --runtime-config when the gate is on.
# GenericWorkload (beta, off by default in 1.37): kube-scheduler and kube-controller-manager
# v1.37.2 watch PodGroups and Workloads through scheduling.k8s.io/v1beta1 (off by default);
# Workload and PodGroup are also served in v1alpha3, which CompositePodGroup needs.
# Checked against pkg/scheduler/eventhandlers.go, cmd/kube-controller-manager/app/resource.go
# and pkg/controlplane/instance.go of k8s.io/kubernetes@v1.37.2.
GATE_RUNTIME_CONFIG: dict[str, dict[str, str]] = {
    "1.37": {"GenericWorkload": "scheduling.k8s.io/v1beta1"},
}

# Controllers a gate needs: with GenericWorkload the API server's admission stamps the
# scheduling.k8s.io/podgroup-protection finalizer on every PodGroup (plugin/pkg/admission/
# scheduling/podgroupprotection); only podgroup-protection-controller removes it, so without
# it a deleted PodGroup never goes.
GATE_CONTROLLERS: dict[str, dict[str, str]] = {
    "1.37": {"GenericWorkload": "podgroup-protection-controller"},
}


def k8s_minor(text: str) -> str:
    """``1.35``, ``v1.35.4``, ``1.35.4`` → ``1.35``; ValueError outside the matrix."""
    parts = text.strip().lstrip("v").split(".")
    minor = ".".join(parts[:2])
    if minor not in K8S_VERSIONS:
        raise ValueError(
            f"--k8s-version: {text!r} is not in the version matrix "
            f"({', '.join(sorted(K8S_VERSIONS))})"
        )
    return minor


CONTROLLERS = (
    "resourceclaim-controller",
    "device-taint-eviction-controller",
    "garbage-collector-controller",
    "namespace-controller",
    "serviceaccount-controller",
    "pod-garbage-collector-controller",
    "validatingadmissionpolicy-status-controller",
    # The chart's workloads on real nodes: the plugin DaemonSet (and its rolling update), the
    # controller Deployment, and the kube-root-ca.crt ConfigMap their API tokens' volumes read.
    "daemonset-controller",
    "deployment-controller",
    "replicaset-controller",
    "root-ca-certificate-publisher-controller",
)

BINARIES = ("etcd", "kube-apiserver", "kube-scheduler", "kube-controller-manager", "kubectl")

# Start order; stop runs in reverse.
COMPONENTS = ("etcd", "kube-apiserver", "kube-scheduler", "kube-controller-manager")

_GATE_NAME = re.compile(r"^[A-Z][A-Za-z0-9]*$")
# An API group/version as kube-apiserver's --runtime-config takes it: "scheduling.k8s.io/v1alpha3",
# "v1" (the core group) or "api/all" / "api/alpha" / "api/beta" / "api/ga".
_API_VERSION = re.compile(r"^(?:[a-z0-9]([a-z0-9.-]*[a-z0-9])?/)?v[0-9]+(?:(?:alpha|beta)[0-9]+)?$")
_API_SHORTCUTS = frozenset({"api/all", "api/alpha", "api/beta", "api/ga"})


class ClusterConfig(BaseModel):
    """Everything the launcher needs, validated once."""

    model_config = ConfigDict(frozen=True)

    state_dir: Path
    bin_dir: Path
    apiserver_port: int = Field(default=0, ge=0, le=65535, description="0 = pick a free port")
    feature_gates: dict[str, bool] = Field(
        default_factory=dict, description="extra gates, override the DRA defaults by name"
    )
    runtime_config_extra: dict[str, bool] = Field(
        default_factory=dict,
        description="extra API group/versions for kube-apiserver --runtime-config, "
        "on top of those the version needs",
    )
    start_timeout_s: float = Field(default=180.0, gt=0)
    die_with_parent: bool = Field(
        default=False, description="SIGKILL the components when the starting process dies"
    )
    verbosity: int = Field(default=1, ge=0, le=10)
    k8s_version: str = Field(
        default=DEFAULT_K8S_VERSION, description="minor version of the binaries in bin_dir"
    )

    @field_validator("k8s_version")
    @classmethod
    def _known_version(cls, version: str) -> str:
        return k8s_minor(version)

    @field_validator("feature_gates")
    @classmethod
    def _gate_names(cls, gates: dict[str, bool]) -> dict[str, bool]:
        for name in gates:
            if not _GATE_NAME.match(name):
                raise ValueError(f"feature gate name {name!r} is not a CamelCase gate name")
        return gates

    @field_validator("runtime_config_extra")
    @classmethod
    def _api_versions(cls, apis: dict[str, bool]) -> dict[str, bool]:
        for name in apis:
            if name not in _API_SHORTCUTS and not _API_VERSION.match(name):
                raise ValueError(
                    f"--runtime-config: {name!r} is not an API group/version "
                    "(e.g. scheduling.k8s.io/v1alpha3) nor api/all|alpha|beta|ga"
                )
        return apis

    def gate_string(self) -> str:
        gates = {**VERSION_GATES[self.k8s_version], **self.feature_gates}
        return ",".join(f"{k}={str(v).lower()}" for k, v in sorted(gates.items()))

    def controllers(self) -> tuple[str, ...]:
        """The controllers to run: :data:`CONTROLLERS` plus those a switched-on gate needs."""
        gates = {**VERSION_GATES[self.k8s_version], **self.feature_gates}
        extra = GATE_CONTROLLERS.get(self.k8s_version, {})
        return CONTROLLERS + tuple(c for gate, c in extra.items() if gates.get(gate))

    def runtime_config(self) -> str:
        """The version's own API versions, those its switched-on gates need, then the extra
        ones (an extra one wins by name)."""
        apis = parse_runtime_config(VERSION_RUNTIME_CONFIG[self.k8s_version])
        gates = {**VERSION_GATES[self.k8s_version], **self.feature_gates}
        for gate, api in GATE_RUNTIME_CONFIG.get(self.k8s_version, {}).items():
            if gates.get(gate):
                apis[api] = True
        apis.update(self.runtime_config_extra)
        return ",".join(f"{k}={str(v).lower()}" for k, v in apis.items())


def parse_gates(
    text: str, *, field: str = "--feature-gates", form: str = "NAME"
) -> dict[str, bool]:
    """``A=true,B=false`` → ``{"A": True, "B": False}``; errors name the field and item.
    Also parses ``--runtime-config`` (``group/version=true,...``) with ``field`` set."""
    gates: dict[str, bool] = {}
    for item in filter(None, (s.strip() for s in text.split(","))):
        name, sep, value = item.partition("=")
        if not sep or value.lower() not in {"true", "false"}:
            raise ValueError(f"{field}: {item!r} is not {form}=true|false")
        gates[name.strip()] = value.lower() == "true"
    return gates


def parse_runtime_config(text: str) -> dict[str, bool]:
    """``scheduling.k8s.io/v1alpha3=true,...`` → ``{"scheduling.k8s.io/v1alpha3": True}``."""
    return parse_gates(text, field="--runtime-config", form="GROUP/VERSION")


@dataclass(frozen=True)
class Layout:
    """Paths inside the state directory."""

    root: Path

    @property
    def pki_dir(self) -> Path:
        return self.root / "pki"

    @property
    def etcd_data(self) -> Path:
        return self.root / "etcd-data"

    @property
    def kubeconfig(self) -> Path:
        return self.root / "kubeconfig"

    @property
    def scheduler_config(self) -> Path:
        return self.root / "kube-scheduler.yaml"

    @property
    def ports_file(self) -> Path:
        return self.root / "ports.json"

    @property
    def cluster_file(self) -> Path:
        return self.root / "cluster.json"

    @property
    def lock_file(self) -> Path:
        return self.root / ".lock"

    def log(self, component: str) -> Path:
        return self.root / "logs" / f"{component}.log"

    def pid_file(self, component: str) -> Path:
        return self.root / "run" / f"{component}.pid"

    def cert_dir(self, component: str) -> Path:
        return self.root / "certs" / component


@dataclass(frozen=True)
class Ports:
    etcd_client: int
    etcd_peer: int
    apiserver: int
    scheduler: int
    controller_manager: int

    def to_json(self) -> str:
        return json.dumps(self.__dict__, indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Ports:
        data = json.loads(text)
        return cls(**{k: int(data[k]) for k in cls.__dataclass_fields__})
