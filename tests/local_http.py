"""A local HTTP server for unit tests: run in a thread for a ``with`` block, one way to
answer a request with a body, and the loopback addresses to reach a server on."""

from __future__ import annotations

import http.client
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import TypeVar

import pytest
from prometheus_client import CollectorRegistry, start_http_server

Server = TypeVar("Server", bound=HTTPServer)


@contextmanager
def serving(server: Server) -> Iterator[Server]:
    """``server`` answering in a thread until the block ends; then shut down and closed."""
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def reply(
    handler: BaseHTTPRequestHandler,
    body: bytes,
    content_type: str = "application/json",
    status: int = 200,
) -> None:
    """Answer the handler's request with ``body`` (its length set, so keep-alive works)."""
    handler.send_response(status)
    handler.send_header("Content-Type", content_type)
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    handler.wfile.write(body)


def _has_ipv6() -> bool:
    """Whether this machine can listen on ``::1`` (not where IPv6 is off in the kernel)."""
    try:
        with socket.socket(socket.AF_INET6) as sock:
            sock.bind(("::1", 0))
    except OSError:
        return False
    return True


HAS_IPV6 = _has_ipv6()
NO_IPV6 = pytest.mark.skipif(not HAS_IPV6, reason="this machine has no IPv6")
# The two loopback addresses, for a test that a server answers on both.
LOOPBACKS = ["127.0.0.1", pytest.param("::1", marks=NO_IPV6)]


def get(host: str, port: int, path: str) -> tuple[int, bytes]:
    """GET ``path`` from ``host:port`` (an IPv6 host bare, ``::1``): status and body."""
    conn = http.client.HTTPConnection(host, port, timeout=10)
    try:
        conn.request("GET", path)
        answer = conn.getresponse()
        return answer.status, answer.read()
    finally:
        conn.close()


@contextmanager
def metrics_page(registry: CollectorRegistry) -> Iterator[str]:
    """``registry`` served by prometheus-client on 127.0.0.1, as a plugin's ``/metrics``:
    the URL, until the block ends."""
    server, thread = start_http_server(0, addr="127.0.0.1", registry=registry)
    try:
        yield f"http://127.0.0.1:{server.server_port}/metrics"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
