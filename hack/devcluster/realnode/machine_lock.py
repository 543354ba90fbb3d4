"""One user of real nodes per machine at a time.

Real nodes change the machine (CNI bridges, iptables rules, sysctls, cgroups), and the
tests compare the machine before and after their nodes; two test sessions, a demo or a
benchmark running real nodes side by side would see each other's changes as leftovers.
:func:`machine_lock` is an exclusive ``flock`` on one file per machine: a second user waits
for the first, and gives up with an error naming the holder after ``timeout_s``.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from hack.devcluster.errors import ClusterError

DEFAULT_PATH = Path("/run/lock/tranche-real-nodes.lock")
POLL_S = 0.5


def lock_path() -> Path:
    """``$TRANCHE_REAL_NODE_LOCK`` or ``/run/lock/tranche-real-nodes.lock`` (``/tmp`` where
    ``/run/lock`` is missing)."""
    override = os.environ.get("TRANCHE_REAL_NODE_LOCK")
    if override:
        return Path(override)
    return DEFAULT_PATH if DEFAULT_PATH.parent.is_dir() else Path("/tmp") / DEFAULT_PATH.name


@contextlib.contextmanager
def machine_lock(
    timeout_s: float, *, path: Path | None = None, on_wait: Callable[[str], None] | None = None
) -> Iterator[None]:
    """Hold the machine's real-node lock for the block; waits up to ``timeout_s`` for it.
    ``on_wait`` (a callable taking the holder's description) is called once when waiting."""
    path = path or lock_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a+") as f:
        deadline = time.monotonic() + timeout_s
        told = False
        while True:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                holder = _holder(path)
                if time.monotonic() >= deadline:
                    raise ClusterError(
                        "real-node lock",
                        f"another user holds {path} ({holder}) after waiting "
                        f"{timeout_s:.0f}s; stop it or wait for it to finish",
                    ) from None
                if not told and on_wait is not None:
                    on_wait(holder)
                    told = True
                time.sleep(POLL_S)
        f.seek(0)
        f.truncate()
        f.write(f"pid {os.getpid()} since {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}\n")
        f.flush()
        try:
            yield
        finally:
            f.seek(0)
            f.truncate()
            f.flush()
            fcntl.flock(f, fcntl.LOCK_UN)


def _holder(path: Path) -> str:
    try:
        text = path.read_text().strip()
    except OSError:
        text = ""
    return text or "holder unknown"
