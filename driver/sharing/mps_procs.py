"""MPS: what the daemons' processes look like in ``/proc``, for :mod:`driver.sharing.mps_daemons`.

A process's state, parent, group and session (``stat``), the ``TRANCHE_MPS_ROOT`` /
``TRANCHE_MPS_KEY`` marks and other variables of its environment (``environ``), every pid,
and the reaping of exited daemon processes orphaned to the plugin. Only reads of ``/proc``
and ``waitpid``: no daemon is started or killed here.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Collection, Iterator
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

MARK_ROOT = "TRANCHE_MPS_ROOT"
MARK_KEY = "TRANCHE_MPS_KEY"


@dataclass(frozen=True)
class _Stat:
    """The fields of ``/proc/<pid>/stat`` this module reads."""

    state: str
    ppid: int
    pgid: int
    sid: int


def proc_stat(pid: int) -> _Stat | None:
    """A process's state, parent, group and session; None when it does not exist (or its
    stat line does not parse)."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
        state, ppid, pgid, sid = raw[raw.rindex(")") + 2 :].split()[:4]
        return _Stat(state, int(ppid), int(pgid), int(sid))
    except (OSError, ValueError):
        return None


def alive(pid: int) -> bool:
    stat = proc_stat(pid)
    return stat is not None and stat.state not in ("Z", "X")


def reap_orphans() -> None:
    """Collect the exit status of exited daemon processes that were orphaned to this process.

    ``nvidia-cuda-mps-control -d`` forks, starts a session of its own and its first process
    exits, so the daemon is an orphan. In a container with a PID namespace of its own the
    plugin is PID 1 and inherits it; each such process that exits (a daemon stopped, one that
    died, the intermediate process of a start) would stay a zombie for as long as the plugin
    runs. In the host's PID namespace none of them is the plugin's child: nothing is found.
    Only children in another session are taken, and the caller holds the daemons' lock, under
    which the one child of this process in another session (the ``-d`` launcher) is waited
    for by its start: no status that a ``subprocess`` call waits for is taken from it.
    """
    me, session = os.getpid(), os.getsid(0)
    for pid in proc_pids():
        stat = proc_stat(pid)
        if stat is None or stat.state != "Z" or stat.ppid != me or stat.sid == session:
            continue
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
            log.debug("mps daemon process reaped pid=%d", pid)


def proc_marks(pid: int) -> dict[str, str]:
    return proc_environ(pid, (MARK_ROOT, MARK_KEY))


def proc_environ(pid: int, names: Collection[str]) -> dict[str, str]:
    """The variables of ``names`` in a process's environment (as it was started); empty
    when it cannot be read."""
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    wanted = {n.encode() for n in names}
    out = {}
    for item in raw.split(b"\0"):
        name, _, value = item.partition(b"=")
        if name in wanted:
            out[name.decode()] = value.decode(errors="replace")
    return out


def proc_pids() -> Iterator[int]:
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            yield int(entry.name)
