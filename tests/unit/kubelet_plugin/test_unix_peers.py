"""Counting the open connections of a listening Unix socket of this process."""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kubelet_plugin.unix_peers import connected_peers
from tests.conftest import in_ci


def _wait_for(path: Path, count: int) -> int | None:
    deadline = time.monotonic() + 5
    peers = connected_peers(str(path))
    while peers != count and time.monotonic() < deadline:
        time.sleep(0.01)
        peers = connected_peers(str(path))
    return peers


def _cannot(reason: str) -> None:
    """Skip on a machine without network namespaces; CI runs as root with them (its real
    nodes need them), so there the test fails rather than hide the check."""
    if in_ci():
        pytest.fail(f"CI=true: {reason}", pytrace=False)
    pytest.skip(reason)


def _listen(path: Path) -> socket.socket:
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen()
    return listener


def test_counts_accepted_connections_until_they_close(tmp_path: Path) -> None:
    path = tmp_path / "dra with space.sock"
    other = tmp_path / "other.sock"
    with _listen(path) as listener, _listen(other) as other_listener:
        assert connected_peers(str(path)) == 0  # the listening socket is not a peer
        clients = [socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) for _ in range(2)]
        accepted = []
        for client in clients:
            client.connect(str(path))
            accepted.append(listener.accept()[0])
        elsewhere = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        elsewhere.connect(str(other))
        taken = other_listener.accept()[0]
        assert connected_peers(str(path)) == 2  # the clients' own ends have no name
        accepted[0].close()
        assert _wait_for(path, 1) == 1
        for sock in (*clients, accepted[1], elsewhere, taken):
            sock.close()
        assert _wait_for(path, 0) == 0


def test_sees_a_client_in_another_network_namespace(tmp_path: Path) -> None:
    """A plugin pod has a network namespace of its own and the kubelet runs in the host's:
    the accepted socket belongs to the kubelet's namespace, which ``/proc/net/unix`` in the
    pod does not list."""
    if shutil.which("unshare") is None:
        _cannot("no unshare(1) on this machine")
    path = tmp_path / "dra.sock"
    client = (
        "import socket, sys, time\n"
        "s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\n"
        f"s.connect({str(path)!r})\n"
        "print('connected', flush=True)\n"
        "sys.stdin.read()\n"
    )
    with _listen(path) as listener:
        kubelet = subprocess.Popen(
            ["unshare", "--net", sys.executable, "-c", client],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert kubelet.stdout is not None
            if kubelet.stdout.readline().strip() != "connected":
                _cannot("unshare --net is not permitted here")
            accepted, _ = listener.accept()
            with accepted:
                own = Path("/proc/net/unix").read_text()
                assert not any(
                    line.split()[5] == "03" and line.endswith(str(path))
                    for line in own.splitlines()[1:]
                )  # what the plugin read before: nothing
                assert connected_peers(str(path)) == 1
        finally:
            assert kubelet.stdin is not None and kubelet.stdout is not None
            kubelet.stdin.close()
            kubelet.wait(10)
            kubelet.stdout.close()


def test_without_descriptors_to_read_the_count_is_unknown_not_zero(tmp_path: Path) -> None:
    assert connected_peers("/x.sock", fd_dir=tmp_path / "missing") is None
