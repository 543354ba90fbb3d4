"""A simulated GPU node: the real ``tranche kubelet-plugin`` process over simulated NVML.

Used by the end-to-end tests, the demo and the benchmarks. Its kubelet is either the
simulator (``hack/kubeletsim``, the default directories under ``root``) or a real kubelet
of ``hack/dev-cluster add-node --kubelet`` (``kubelet_root`` and ``cdi_root`` of that node).
The plugin runs as a child process in its own process group (so tests can SIGKILL it at a fault
point and start it again); the simulated GPUs live in a state file that
outlives the process, as hardware would.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from driver.nvml.sim import SimControl, SimStore, create_state

START_TIMEOUT_S = 60.0


class SimNodeError(RuntimeError):
    """The plugin did not come up; the message carries the end of its log."""


@dataclass(frozen=True)
class SimNodeConfig:
    node_name: str
    kubeconfig: str
    root: Path  # keep it short: Unix socket paths must stay under 108 bytes
    profile: str = "dgx-h100"
    driver_name: str = "gpu.tranche.dev"
    extra_args: Sequence[str] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    # A real node's directories (``hack/dev-cluster add-node --kubelet`` prints them); by
    # default ``root/kubelet`` and ``root/cdi``, for the kubelet simulator.
    kubelet_root: Path | None = None
    cdi_root: Path | None = None
    # What runs ``tranche``: by default this checkout under the current interpreter; the
    # benchmarks pass the image's (``hack/image_rootfs.py``), whose environment is the image's.
    program: Sequence[str] = ()


class SimNode:
    """One simulated node's plugin process and its directories."""

    def __init__(self, config: SimNodeConfig) -> None:
        self.config = config
        self.kubelet_root = config.kubelet_root or config.root / "kubelet"
        self.cdi_root = config.cdi_root or config.root / "cdi"
        self.sim_state = config.root / "gpus.json"
        self.log_path = config.root / "plugin.log"
        self._proc: subprocess.Popen[bytes] | None = None
        for d in (config.root, self.kubelet_root, self.cdi_root):
            d.mkdir(parents=True, exist_ok=True)
        if not self.sim_state.exists():
            create_state(config.profile, self.sim_state, node=config.node_name)

    @property
    def data_dir(self) -> Path:
        return self.kubelet_root / "plugins" / self.config.driver_name

    @property
    def registration_socket(self) -> Path:
        return self.kubelet_root / "plugins_registry" / f"{self.config.driver_name}-reg.sock"

    def control(self) -> SimControl:
        """Drive the simulated GPUs (inject XIDs, add processes) of the running plugin."""
        return SimControl(SimStore(path=self.sim_state))

    def command(self) -> list[str]:
        program = self.config.program or (sys.executable, "-m", "driver.cli")
        return [
            *program, "kubelet-plugin",
            "--node-name", self.config.node_name,
            "--driver-name", self.config.driver_name,
            "--kubelet-root-dir", str(self.kubelet_root),
            "--cdi-root", str(self.cdi_root),
            "--nvml", "simulated",
            "--sim-state", str(self.sim_state),
            "--kubeconfig", self.config.kubeconfig,
            "--metrics-address", "",
            "--health-address", "",
            *self.config.extra_args,
        ]  # fmt: skip

    def start(self, env: Mapping[str, str] | None = None, wait: bool = True) -> None:
        """Start the plugin; with ``wait``, until its registration socket exists."""
        if self.running():
            raise SimNodeError(f"plugin of {self.config.node_name} is already running")
        full_env = {**os.environ, **self.config.env, **(env or {})}
        full_env["PYTHONUNBUFFERED"] = "1"
        with self.log_path.open("ab") as log:
            self._proc = subprocess.Popen(
                self.command(),
                stdout=log,
                stderr=subprocess.STDOUT,
                env=full_env,
                process_group=0,
            )
        if wait:
            self.wait_serving()

    def wait_serving(self, timeout_s: float = START_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.registration_socket.exists():
                return
            if self._proc is not None and self._proc.poll() is not None:
                break
            time.sleep(0.1)
        raise SimNodeError(
            f"plugin of {self.config.node_name} is not serving "
            f"(exit code {self.exit_code()}); last lines of {self.log_path}:\n{self.log_tail()}"
        )

    def wait_exit(self, timeout_s: float = START_TIMEOUT_S) -> int:
        """Wait for the plugin to end by itself (e.g. at a fault point); its exit code."""
        if self._proc is None:
            raise SimNodeError("plugin was never started")
        return self._proc.wait(timeout=timeout_s)

    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def exit_code(self) -> int | None:
        return None if self._proc is None else self._proc.poll()

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    def hanging_at(self, point: str) -> bool:
        """A ``hang`` fault point (``TRANCHE_FAULT_ACTION=hang``) holds a thread at ``point``."""
        return self.running() and f"fault point reached point={point}" in self.log_tail(200)

    def kill(self) -> None:
        """SIGKILL the plugin's process group: a crash, nothing cleaned up."""
        if self._proc is not None and self._proc.poll() is None:
            os.killpg(self._proc.pid, signal.SIGKILL)
            self._proc.wait()

    def stop(self, timeout_s: float = 20.0) -> int | None:
        """SIGTERM and wait (in-flight calls finish, sockets removed); SIGKILL after timeout."""
        if self._proc is None:
            return None
        if self._proc.poll() is None:
            os.killpg(self._proc.pid, signal.SIGTERM)
            try:
                self._proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.kill()
        return self._proc.returncode

    def log_tail(self, lines: int = 30) -> str:
        if not self.log_path.exists():
            return "(no log)"
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
