"""Start, find and stop the control-plane processes.

Each component runs in its own session (so its own process group, pgid = pid),
with stdout and stderr in one log file and its pid in a pid file. Stopping
sends SIGTERM to the group, waits, then SIGKILL. A pid read from a file is
only signalled when ``/proc/<pid>/cmdline`` still contains the cluster's state
directory, so a recycled pid never hits an unrelated process.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import random
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from hack.devcluster.errors import StartError

log = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1
_LOG_TAIL_LINES = 25


@dataclass(frozen=True)
class ProcessSpec:
    """How to run one component."""

    name: str
    argv: tuple[str, ...]
    log_file: Path
    pid_file: Path
    env: Mapping[str, str] | None = None  # None: inherit this process's environment


def log_tail(path: Path, lines: int = _LOG_TAIL_LINES) -> str:
    """The last ``lines`` lines of a log file ('' if there is none)."""
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 64 * 1024))
            data = f.read().decode(errors="replace")
    except FileNotFoundError:
        return ""
    return "\n".join(data.splitlines()[-lines:])


def port_free(port: int) -> bool:
    """Whether 127.0.0.1:``port`` can be bound now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


_EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
# Above the well-known ports and the Kubernetes components' defaults (10250-10259).
LOWEST_PORT = 20000


def _ephemeral_start() -> int:
    try:
        return int(_EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port() -> int:
    """A port on 127.0.0.1 that nothing listens on now, below the kernel's range for outgoing
    connections.

    A port found by binding to port 0 comes from that range, so between the probe closing it
    and the server binding it, any outgoing connection of the machine (the API server's, a
    kubelet's, a test's) may take it as its own source port, and the server then fails to
    start with EADDRINUSE. A port below the range is never handed out that way.
    """
    top = max(_ephemeral_start(), LOWEST_PORT + 1000)
    for _ in range(200):
        port = random.randrange(LOWEST_PORT, top)
        if port_free(port):
            return port
    raise RuntimeError(f"no free port on 127.0.0.1 in {LOWEST_PORT}-{top - 1} after 200 tries")


def _die_with_parent() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def start(spec: ProcessSpec, *, die_with_parent: bool) -> subprocess.Popen[bytes]:
    """Start ``spec`` in a new session; write its pid file."""
    spec.log_file.parent.mkdir(parents=True, exist_ok=True)
    spec.pid_file.parent.mkdir(parents=True, exist_ok=True)
    with spec.log_file.open("ab") as out:
        try:
            proc = subprocess.Popen(
                spec.argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                close_fds=True,
                env=spec.env,
                preexec_fn=_die_with_parent if die_with_parent else None,  # noqa: PLW1509
            )
        except OSError as e:
            raise StartError(spec.name, f"cannot execute: {e}", spec.argv, "") from e
    spec.pid_file.write_text(f"{proc.pid}\n")
    log.info("started component=%s pid=%d log=%s", spec.name, proc.pid, spec.log_file)
    return proc


def read_pid(pid_file: Path) -> int | None:
    try:
        return int(pid_file.read_text().strip())
    except (FileNotFoundError, ValueError):
        return None


def _state(pid: int) -> str | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    return stat.rsplit(")", 1)[1].split()[0]


def alive(pid: int) -> bool:
    """The process exists and is not a zombie."""
    state = _state(pid)
    return state is not None and state != "Z"


def owned(pid: int, marker: str) -> bool:
    """The live process ``pid`` was started for the cluster whose state dir is ``marker``."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return False
    return alive(pid) and marker in cmdline


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes in process group ``pgid``."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            members.append(int(entry.name))
    return members


def _reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


def stop_group(pgid: int, *, timeout_s: float = 20.0) -> None:
    """SIGTERM the group, wait up to ``timeout_s``, then SIGKILL it and wait again."""
    for sig, wait_s in ((signal.SIGTERM, timeout_s), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            _reap(pgid)
            return
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            _reap(pgid)
            if not group_members(pgid):
                return
            time.sleep(0.1)
    log.warning("process group still alive after SIGKILL pgid=%d", pgid)


def wait_ready(
    spec: ProcessSpec,
    proc: subprocess.Popen[bytes],
    probe: Callable[[], bool],
    *,
    timeout_s: float,
) -> None:
    """Poll ``probe`` until it is true; fail if the process exits or time runs out."""
    deadline = time.monotonic() + timeout_s
    while True:
        code = proc.poll()
        if code is not None:
            raise StartError(
                spec.name,
                f"exited with code {code} during start-up",
                spec.argv,
                log_tail(spec.log_file),
            )
        if probe():
            return
        if time.monotonic() > deadline:
            raise StartError(
                spec.name,
                f"not ready after {timeout_s:.0f}s",
                spec.argv,
                log_tail(spec.log_file),
            )
        time.sleep(0.25)


def require_ports_free(step: str, ports: Sequence[int], argv: Sequence[str]) -> None:
    """Fail with an error naming the port when one is taken."""
    for port in ports:
        if not port_free(port):
            raise StartError(step, f"port 127.0.0.1:{port} is already in use", argv, "")
