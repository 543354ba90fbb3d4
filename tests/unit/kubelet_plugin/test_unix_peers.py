"""Counting the open connections of a listening Unix socket."""

from __future__ import annotations

import socket
import time
from pathlib import Path

from kubelet_plugin.unix_peers import connected_peers


def _wait_for(path: Path, count: int) -> int | None:
    deadline = time.monotonic() + 5
    peers = connected_peers(str(path))
    while peers != count and time.monotonic() < deadline:
        time.sleep(0.01)
        peers = connected_peers(str(path))
    return peers


def test_counts_accepted_connections_until_the_client_closes(tmp_path: Path) -> None:
    path = tmp_path / "dra with space.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen()
    other = tmp_path / "other.sock"
    other_listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    other_listener.bind(str(other))
    other_listener.listen()
    try:
        assert connected_peers(str(path)) == 0  # the listening socket is not a peer
        clients = [socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) for _ in range(2)]
        accepted = []
        for client in clients:
            client.connect(str(path))
            accepted.append(listener.accept()[0])
        elsewhere = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        elsewhere.connect(str(other))
        taken = other_listener.accept()[0]
        assert connected_peers(str(path)) == 2
        clients[0].close()
        accepted[0].close()
        assert _wait_for(path, 1) == 1
        for sock in (clients[1], accepted[1], elsewhere, taken):
            sock.close()
        assert _wait_for(path, 0) == 0
    finally:
        listener.close()
        other_listener.close()


def test_an_unreadable_table_is_unknown_not_zero(tmp_path: Path) -> None:
    assert connected_peers("/x.sock", table=str(tmp_path / "missing")) is None
