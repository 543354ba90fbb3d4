"""A local HTTP server for unit tests: run in a thread for a ``with`` block, and one way to
answer a request with a body."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import TypeVar

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
