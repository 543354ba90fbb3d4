"""A TCP relay to the API server that a test can cut and restore: an outage seen
by one client only, without stopping the shared control plane.

While cut, the listening socket is closed (connections are refused) and open
connections are dropped; TLS passes through untouched. While stalled, connections stay open
and new ones are accepted, but nothing is forwarded: a peer gone silent without a reset.
"""

from __future__ import annotations

import contextlib
import select
import socket
import threading
from urllib.parse import urlparse

from tests.ports import free_port


class TcpRelay:
    def __init__(self, target_url: str, host: str = "127.0.0.1", port: int = 0) -> None:
        """Relay to ``target_url`` from ``host:port`` (with 0, a free port of 127.0.0.1)."""
        parsed = urlparse(target_url)
        self._target = (parsed.hostname or "127.0.0.1", parsed.port or 443)
        self._scheme = parsed.scheme
        self.host = host
        self.port = port
        if not port:  # it is bound again at each up(): one no outgoing connection takes
            self.port = free_port()
        self._listener: socket.socket | None = None
        self._conns: list[socket.socket] = []
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self.accepted = 0  # connections accepted so far
        self._flowing = threading.Event()
        self._flowing.set()

    @property
    def url(self) -> str:
        return f"{self._scheme}://{self.host}:{self.port}"

    def up(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((self.host, self.port))
        listener.listen(16)
        self._listener = listener
        t = threading.Thread(target=self._accept, args=(listener,), daemon=True)
        t.start()
        self._threads.append(t)

    def down(self) -> None:
        listener, self._listener = self._listener, None
        if listener is not None:
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)
            listener.close()
        with self._lock:
            conns, self._conns = self._conns, []
        for c in conns:
            with contextlib.suppress(OSError):
                c.shutdown(socket.SHUT_RDWR)
            c.close()
        for t in self._threads:
            t.join(5)
        self._threads = [t for t in self._threads if t.is_alive()]

    def stall(self) -> None:
        """Stop forwarding, in both directions, keeping every connection open."""
        self._flowing.clear()

    def resume(self) -> None:
        self._flowing.set()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self._target, timeout=5)
            except OSError:
                conn.close()
                continue
            with self._lock:
                self._conns += [conn, upstream]
                self.accepted += 1
            t = threading.Thread(target=self._pump, args=(conn, upstream), daemon=True)
            t.start()

    def _pump(self, a: socket.socket, b: socket.socket) -> None:
        peers = {a: b, b: a}
        try:
            while True:
                if not self._flowing.wait(1.0):
                    continue
                readable, _, _ = select.select([a, b], [], [], 1.0)
                for s in readable:
                    data = s.recv(65536)
                    if not data:
                        return
                    peers[s].sendall(data)
        except (OSError, ValueError):
            return
        finally:
            for s in (a, b):
                with contextlib.suppress(OSError):
                    s.close()
