"""One ``/dev/shm`` for an MPS control daemon and the containers of its claims.

CUDA clients and the MPS server exchange memory through ``/dev/shm``, while every pod has a
``/dev/shm`` of its own: without a shared one, real CUDA clients cannot reach the server.
Each daemon therefore gets a directory, ``<daemon dir>/shm``: the daemon is started in a
mount namespace of its own in which that directory is bind-mounted on ``/dev/shm``
(``unshare --mount``, then ``mount --bind``), and every container of its claims gets the same
directory at ``/dev/shm`` through its CDI spec. It is a plain directory of the node's state
directory, not a tmpfs the plugin mounts: a mount made in the plugin's container would be seen
by the daemon but, without ``Bidirectional`` propagation on the state directory's volume, not
by the container runtime that mounts it into the clients.

``mpsSharedShm`` in ``--sharing``: ``auto`` (default) shares it where the plugin may make mount
namespaces (root with ``CAP_SYS_ADMIN``, ``unshare`` and ``mount`` on ``PATH``) and says once,
at start, why not elsewhere; ``on`` refuses to start without it; ``off`` never shares it.
"""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

from driver.errors import ConfigError

log = logging.getLogger(__name__)

SHM_IN_CONTAINER = "/dev/shm"
ENV_SHM = "TRANCHE_MPS_SHM"  # set for the daemon: the directory behind its /dev/shm
MODES = ("auto", "on", "off")
CAP_SYS_ADMIN = 21
# Runs inside the new mount namespace: bind the directory on /dev/shm, then exec the daemon.
_BIND = 'mount --bind "$1" /dev/shm || exit 1; shift; exec "$@"'


def why_not_shareable(status: Path = Path("/proc/self/status")) -> str | None:
    """Why this process cannot bind a directory on a daemon's ``/dev/shm``; None when it can."""
    if os.geteuid() != 0:
        return "the plugin does not run as root"
    try:
        caps = next(
            int(line.split()[1], 16)
            for line in status.read_text().splitlines()
            if line.startswith("CapEff:")
        )
    except (OSError, StopIteration, ValueError, IndexError) as e:
        return f"its capabilities cannot be read from {status} ({e})"
    if not caps >> CAP_SYS_ADMIN & 1:
        return "the plugin lacks CAP_SYS_ADMIN (make mount namespaces)"
    missing = [b for b in ("unshare", "mount") if shutil.which(b) is None]
    if missing:
        return f"{' and '.join(missing)} not found on PATH"
    return None


def resolve(mode: str, *, why_not: str | None = None) -> bool:
    """Whether daemons get a shared ``/dev/shm`` in ``mode`` on this node (module docstring);
    ``why_not`` is :func:`why_not_shareable`'s answer (asked here when not given)."""
    if mode not in MODES:
        raise ConfigError(f"sharing.mpsSharedShm: {mode!r} is not one of {', '.join(MODES)}")
    if mode == "off":
        return False
    reason = why_not if why_not is not None else why_not_shareable()
    if reason is None:
        return True
    if mode == "on":
        raise ConfigError(f"sharing.mpsSharedShm=on: {reason}")
    log.warning(
        "mps daemons get no shared /dev/shm reason=%r effect=%r",
        reason,
        "real CUDA clients cannot reach an MPS server from another pod's /dev/shm; "
        "set sharing.mpsSharedShm=off to silence this or run the plugin privileged",
    )
    return False


def bind_command(shm: Path, command: list[str]) -> list[str]:
    """``command`` run in a mount namespace of its own with ``shm`` on ``/dev/shm``."""
    return ["unshare", "--mount", "--propagation", "private", "/bin/sh", "-c", _BIND, "sh",
            str(shm), *command]  # fmt: skip


def make_dir(shm: Path) -> None:
    """The daemon's shm directory, empty, writable by every client user (sticky, like
    ``/dev/shm``)."""
    shm.mkdir(parents=True, exist_ok=True)
    shm.chmod(0o1777)
    for leftover in shm.iterdir():
        if leftover.is_dir() and not leftover.is_symlink():
            shutil.rmtree(leftover, ignore_errors=True)
        else:
            leftover.unlink(missing_ok=True)
