"""Keep-alive HTTP(S) connections to one API server, on the standard library's ``http.client``.

:class:`ConnectionPool` hands out one connection per request and takes it back when its
answer has been read whole. Idle connections are kept (at most ``size``, newest first); one
the server has closed meanwhile (readable while idle: its EOF or stray bytes) is dropped
before reuse, as is one whose answer asked to close or was not read to the end. More
requests in flight than ``size`` open extra connections, closed after use.

The plugin used urllib3 for this; ``http.client`` alone answers a claim read 0.2-0.3 ms
sooner and keeps about 1 MiB less resident (docs/performance.md).
"""

from __future__ import annotations

import contextlib
import http.client
import select
import socket
import ssl
import threading
from urllib.parse import urlsplit

# Raised by a request that got no (whole) answer: refused, reset, timed out, TLS, bad HTTP.
TRANSPORT_ERRORS = (OSError, http.client.HTTPException)


class _TlsConnection(http.client.HTTPSConnection):
    """HTTPS with the server name checked (and sent as SNI) set apart from the host dialled:
    a kubeconfig's ``tls-server-name``."""

    def __init__(
        self,
        host: str,
        port: int | None,
        *,
        context: ssl.SSLContext,
        server_hostname: str | None,
        timeout: float,
    ) -> None:
        super().__init__(host, port, timeout=timeout, context=context)
        self._tls = context
        self._server_hostname = server_hostname or host

    def connect(self) -> None:
        http.client.HTTPConnection.connect(self)
        self.sock = self._tls.wrap_socket(self.sock, server_hostname=self._server_hostname)


def _dropped(conn: http.client.HTTPConnection) -> bool:
    """Whether an idle connection can no longer carry a request: closed, or readable (the
    server's EOF or bytes nobody asked for)."""
    sock = conn.sock
    if sock is None:
        return True
    if isinstance(sock, ssl.SSLSocket) and sock.pending():
        return True
    poller = select.poll()
    try:
        poller.register(sock, select.POLLIN | select.POLLERR | select.POLLHUP)
        return bool(poller.poll(0))
    except (OSError, ValueError):
        return True


class ConnectionPool:
    """Connections to ``server`` (``https://host:port[/prefix]``); thread-safe."""

    def __init__(
        self,
        server: str,
        *,
        size: int,
        context: ssl.SSLContext | None = None,
        server_hostname: str | None = None,
    ) -> None:
        try:
            url = urlsplit(server)
            port = url.port  # ValueError: not a number, or out of range
        except ValueError as e:
            raise ValueError(f"server {server!r}: {e}") from None
        if url.scheme not in ("http", "https") or not url.hostname:
            raise ValueError(f"server {server!r} is not an http(s)://HOST[:PORT] URL")
        self.prefix = url.path.rstrip("/")
        self._host = url.hostname
        self._port = port
        if url.scheme == "https" and context is None:
            context = ssl.create_default_context()
        self._context = context
        self._server_hostname = server_hostname
        self._size = size
        self._idle: list[http.client.HTTPConnection] = []
        self._lock = threading.Lock()
        self._closed = False

    def new(self, timeout_s: float) -> http.client.HTTPConnection:
        """A connection of its own (not from the pool); it connects on first use."""
        if self._context is not None:
            return _TlsConnection(
                self._host,
                self._port,
                context=self._context,
                server_hostname=self._server_hostname,
                timeout=timeout_s,
            )
        return http.client.HTTPConnection(self._host, self._port, timeout=timeout_s)

    def take(self, timeout_s: float) -> http.client.HTTPConnection:
        """An idle connection still open (its timeout set to ``timeout_s``), else a new one."""
        while True:
            with self._lock:
                conn = self._idle.pop() if self._idle else None
            if conn is None:
                return self.new(timeout_s)
            if _dropped(conn):
                conn.close()
                continue
            conn.timeout = timeout_s
            if conn.sock is not None:
                conn.sock.settimeout(timeout_s)
            return conn

    def give_back(
        self, conn: http.client.HTTPConnection, response: http.client.HTTPResponse
    ) -> None:
        """Keep ``conn`` for the next request if its answer was read whole and it stays open."""
        if response.will_close or not response.isclosed() or conn.sock is None:
            conn.close()
            return
        with self._lock:
            if not self._closed and len(self._idle) < self._size:
                self._idle.append(conn)
                return
        conn.close()

    def close(self) -> None:
        """Close the idle connections; those in use close when given back."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()


def shut_down(conn: http.client.HTTPConnection) -> None:
    """Make a read blocked on ``conn`` in another thread return (EOF, then an error).

    Only the socket is shut down, with the plain socket call: ``SSLSocket.shutdown`` would
    drop the TLS state under the reading thread's feet. The reading thread closes ``conn``."""
    sock = conn.sock
    if sock is not None:
        with contextlib.suppress(OSError):
            socket.socket.shutdown(sock, socket.SHUT_RDWR)
