"""Who is still connected to one of this process's listening Unix sockets.

Read from the process's own descriptors: every socket that ``accept`` returned on a listener
bound at a path reports that path as its own name (``getsockname``) until it is closed, and
the listener itself is the one that accepts connections (``SO_ACCEPTCONN``). The kernel's
``/proc/net/unix`` would not do: it lists the sockets of the reader's network namespace, and
an accepted socket belongs to the connecting side's, so a plugin pod (a namespace of its own)
never sees there the kubelet's connections (the host's).
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

FD_DIR = Path("/proc/self/fd")


def connected_peers(path: str, fd_dir: Path = FD_DIR) -> int | None:
    """Open connections accepted on the socket bound at ``path``, held by this process;
    None where its descriptors cannot be listed (no ``/proc``)."""
    try:
        entries = list(fd_dir.iterdir())
    except OSError:
        return None
    return sum(1 for entry in entries if _accepted_on(entry, path))


def _accepted_on(entry: Path, path: str) -> bool:
    try:
        if not str(entry.readlink()).startswith("socket:"):
            return False
        fd = int(entry.name)
        copy = os.dup(fd)  # closed meanwhile: EBADF; reused for another socket: counted once
    except OSError:
        return False
    try:
        sock = socket.socket(fileno=copy)  # takes ``copy`` over, family read from the socket
    except OSError:
        os.close(copy)
        return False
    with sock:
        try:
            return (
                sock.family == socket.AF_UNIX
                and not sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)
                and sock.getsockname() == path
            )
        except OSError:
            return False
