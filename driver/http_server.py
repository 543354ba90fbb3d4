"""The HTTP servers' listening socket: one rule for every ``HOST:PORT`` address flag.

An empty host (``:9400``, :data:`ALL_ADDRESSES` from :func:`driver.flags.parse_address`)
listens on every address of the pod, IPv4 and IPv6, as ``:PORT`` does in Go: one IPv6
socket on ``::`` with ``IPV6_V6ONLY`` off, which takes IPv4 connections too. The kubelet
probes the pod's primary IP, and the API server and Prometheus reach it through Services, so
on an IPv6-only or IPv6-primary cluster an IPv4-only socket answers none of them. Where the
kernel has no IPv6 (Python built without it, ``ipv6.disable=1``) it listens on ``0.0.0.0``.

An explicit host keeps its meaning: ``0.0.0.0`` IPv4 only, ``[::]`` as the OS does
(``net.ipv6.bindv6only``, off by default on Linux), ``127.0.0.1`` or ``[::1]`` loopback.
"""

from __future__ import annotations

import errno
import logging
import socket
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

log = logging.getLogger(__name__)

ALL_ADDRESSES = ""  # the host of ":PORT"

# What creating or binding an IPv6 socket fails with where the kernel has no IPv6.
_NO_IPV6 = frozenset({errno.EAFNOSUPPORT, errno.EADDRNOTAVAIL})


def socket_family(host: str) -> socket.AddressFamily:
    """The family that can bind an explicit ``host``: IPv6 for an IPv6 host (``::``,
    ``fd00::1``), which an IPv4 socket cannot bind; IPv4 otherwise."""
    return socket.AF_INET6 if ":" in host else socket.AF_INET


class HttpServer(ThreadingHTTPServer):
    """A ThreadingHTTPServer listening on ``(host, port)`` of ``parse_address``, an empty
    host on every address (the module docstring). Raises OSError where it cannot listen."""

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler]) -> None:
        host, port = address
        self._dual_stack = host == ALL_ADDRESSES and socket.has_ipv6
        if self._dual_stack:
            self.address_family = socket.AF_INET6
            try:
                super().__init__(("::", port), handler)
                return
            except OSError as e:
                if e.errno not in _NO_IPV6:
                    raise
                log.info("http server without ipv6 port=%d error=%s", port, e.strerror)
            self._dual_stack = False
        if host == ALL_ADDRESSES:
            host = "0.0.0.0"
        self.address_family = socket_family(host)
        super().__init__((host, port), handler)

    def server_bind(self) -> None:
        if self._dual_stack:
            self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        super().server_bind()
