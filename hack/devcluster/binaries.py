"""Find the control-plane binaries (hack/build-k8s.sh) and a real node's (hack/build-node.sh)
of one Kubernetes version; each is cached after one build."""

from __future__ import annotations

import subprocess
from pathlib import Path

from hack.devcluster.errors import ClusterError

REPO = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = REPO / "hack" / "build-k8s.sh"


def build_or_find(k8s_version: str | None = None) -> Path:
    """Run ``hack/build-k8s.sh [--version MINOR]`` (a no-op when cached) and return its binary
    directory; without a version the script's default (1.37, or ``TRANCHE_K8S_VERSION``).

    Build progress goes to this process's stderr.
    """
    argv = [str(BUILD_SCRIPT), *(["--version", k8s_version] if k8s_version else [])]
    try:
        done = subprocess.run(argv, stdout=subprocess.PIPE, text=True, check=False)
    except OSError as e:
        raise ClusterError("build control plane", f"cannot run {BUILD_SCRIPT}: {e}") from e
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        raise ClusterError(
            "build control plane",
            f"{BUILD_SCRIPT} exited with code {done.returncode}; its stderr above says why",
        )
    return Path(lines[-1])


NODE_BUILD_SCRIPT = REPO / "hack" / "build-node.sh"


def build_or_find_node(k8s_version: str | None = None) -> Path:
    """Run ``hack/build-node.sh [--version MINOR]`` (the kubelet of that release, containerd,
    shim, ctr; cached) and return its binary directory; without a version the script's
    default (1.37, or ``TRANCHE_K8S_VERSION``). It also installs runc, the CNI plugins and
    busybox-static when missing.
    """
    argv = [str(NODE_BUILD_SCRIPT), *(["--version", k8s_version] if k8s_version else [])]
    try:
        done = subprocess.run(argv, stdout=subprocess.PIPE, text=True, check=False)
    except OSError as e:
        raise ClusterError("build node binaries", f"cannot run {NODE_BUILD_SCRIPT}: {e}") from e
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        raise ClusterError(
            "build node binaries",
            f"{NODE_BUILD_SCRIPT} exited with code {done.returncode}; its stderr above says why",
        )
    return Path(lines[-1])
