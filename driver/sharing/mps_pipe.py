"""MPS: talking to a daemon through its control pipe, for :mod:`driver.sharing.mps_daemons`.

``nvidia-cuda-mps-control`` run with the daemon's environment (its pipe and log directories,
its device, the marks of :mod:`driver.sharing.mps_procs`): whether a daemon answers
(``get_server_list``), and control commands (``quit``, the daemon-wide defaults).
"""

from __future__ import annotations

import logging
import os
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

from driver.errors import ClaimError
from driver.sharing import mps_shm
from driver.sharing.mps_procs import MARK_KEY, MARK_ROOT
from driver.sharing.mps_records import DaemonRecords, DaemonSpec

log = logging.getLogger(__name__)

CONTROL_TIMEOUT_S = 10.0
PROBE_TIMEOUT_S = 3.0  # a live daemon answers get_server_list at once


class DaemonPipes(DaemonRecords):
    """The daemons under ``root``, reached through their control pipes with ``binary``;
    ``environ``: the environment every control process (and daemon) starts from."""

    def __init__(
        self,
        binary: str,
        root: Path,
        shared_shm: bool,
        environ: Mapping[str, str] | None,
    ) -> None:
        super().__init__(root, shared_shm)
        self.binary = binary
        self._environ = dict(os.environ if environ is None else environ)

    def _env(self, spec: DaemonSpec) -> dict[str, str]:
        shm = {mps_shm.ENV_SHM: str(self.shm_dir(spec.key))} if self.shared_shm else {}
        return (
            self._environ
            | shm
            | {
                "CUDA_MPS_PIPE_DIRECTORY": str(self.pipe_dir(spec.key)),
                "CUDA_MPS_LOG_DIRECTORY": str(self.log_dir(spec.key)),
                "CUDA_VISIBLE_DEVICES": spec.uuid,
                MARK_ROOT: str(self.root.resolve()),
                MARK_KEY: spec.key,
            }
        )

    def answers(self, spec: DaemonSpec) -> bool:
        """Whether a daemon serves the control pipe of ``spec.key`` (``get_server_list``)."""
        if not (self.pipe_dir(spec.key) / "control").exists():
            return False
        try:
            done = subprocess.run(
                [self.binary],
                env=self._env(spec),
                input=b"get_server_list\n",
                capture_output=True,
                timeout=PROBE_TIMEOUT_S,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as e:
            log.warning("mps control probe failed key=%s error=%s", spec.key, e)
            return False
        return done.returncode == 0

    def control(self, key: str, commands: Sequence[str]) -> None:
        """Send control commands to the daemon of ``key`` (``nvidia-cuda-mps-control`` stdin)."""
        self._send(self.records()[key][0], commands)

    def _send(self, spec: DaemonSpec, commands: Sequence[str]) -> None:
        if not commands:
            return
        key = spec.key
        try:
            done = subprocess.run(
                [self.binary],
                env=self._env(spec),
                input="".join(c + "\n" for c in commands).encode(),
                capture_output=True,
                timeout=CONTROL_TIMEOUT_S,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as e:
            raise ClaimError(f"MPS control daemon for {key}: control commands failed: {e}") from e
        if done.returncode != 0:
            raise ClaimError(
                f"MPS control daemon for {key}: {commands} exited with {done.returncode}: "
                f"{done.stderr.decode(errors='replace').strip()[:300]}"
            )
