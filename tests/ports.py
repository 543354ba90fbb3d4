"""Ports for servers the tests start, outside the kernel's range for outgoing connections.

A port found by binding to port 0 comes from that range, so between the probe closing it
and the server binding it, any outgoing connection of the machine (the API server's, the
kubelet's, another test's) may take it as its own source port, and the server fails to
start with EADDRINUSE. A port below the range is never handed out that way; the bind here
checks that nobody listens on it now.
"""

from __future__ import annotations

import random
from pathlib import Path

from hack.devcluster.processes import port_free

_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_LOWEST = 20000  # above the well-known and the Kubernetes components' ports (10250-10259)


def _ephemeral_start() -> int:
    try:
        return int(_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port() -> int:
    """A port on 127.0.0.1 that nothing listens on now, below the ephemeral range."""
    top = max(_ephemeral_start(), _LOWEST + 1000)
    for _ in range(200):
        port = random.randrange(_LOWEST, top)
        if port_free(port):
            return port
    raise RuntimeError(f"no free port on 127.0.0.1 in {_LOWEST}-{top - 1} after 200 tries")
