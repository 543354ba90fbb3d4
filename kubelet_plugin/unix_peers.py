"""Who is still connected to a listening Unix socket, read from ``/proc/net/unix``.

The kernel lists every Unix socket of the reader's network namespace, one per line::

    Num RefCount Protocol Flags Type St Inode Path

A socket that ``accept`` returned carries the path of the listening socket it came from and
state ``03`` (connected) until either side closes it; the listening socket itself has state
``01``. So the connected entries under a server's path are its open client connections: the
plugin reads them to see when the kubelet has dropped its connection to the DRA socket.
"""

from __future__ import annotations

PROC_NET_UNIX = "/proc/net/unix"
_CONNECTED = "03"


def connected_peers(path: str, table: str = PROC_NET_UNIX) -> int | None:
    """Open connections accepted on the socket bound at ``path``; None where the table
    cannot be read (no ``/proc``)."""
    count = 0
    try:
        with open(table, encoding="utf-8", errors="replace") as lines:
            next(lines, None)  # the header
            for line in lines:
                fields = line.rstrip("\n").split(None, 7)
                if len(fields) == 8 and fields[5] == _CONNECTED and fields[7] == path:
                    count += 1
    except OSError:
        return None
    return count
