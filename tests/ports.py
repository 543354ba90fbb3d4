"""Ports for servers the tests start: :func:`hack.devcluster.processes.free_port`, which picks
them below the kernel's range for outgoing connections (its docstring says why), as the dev
cluster does for its own components."""

from __future__ import annotations

from hack.devcluster.processes import free_port

__all__ = ["free_port"]
