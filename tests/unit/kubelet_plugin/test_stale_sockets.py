"""Sockets that earlier plugin pods of this driver left behind (a SIGKILL), removed at start
where nobody serves them; real Unix sockets in a short temporary directory."""

from __future__ import annotations

import logging
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from kubelet_plugin.grpc_server import PluginServer, dra_socket_name, registration_socket_name
from tests.unit.kubelet_doubles import RecordingDriver

REPO = Path(__file__).resolve().parents[3]
DRIVER = "gpu.tranche.dev"
OLD = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"  # a pod killed with SIGKILL
LIVE = "6c1d2a4e-1111-4a2b-9c3d-5e6f7a8b9c0d"  # the other pod of a rolling update
NEW = "db788049-2e1d-4bb0-a817-9b3cfc86a7b4"  # the pod that starts now
# Under a long kubelet root the UID gives way to a hash of it (grpc_server).
LONG_REGISTRY = "/" + "d" * 40 + "/plugins_registry"
LONG_PLUGIN_DIR = "/" + "d" * 40 + f"/plugins/{DRIVER}"


@pytest.fixture
def sockets() -> Iterator[list[socket.socket]]:
    held: list[socket.socket] = []
    yield held
    for s in held:
        s.close()


def _dead(path: Path) -> Path:
    """A socket file whose server is gone, as a SIGKILL leaves it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.bind(str(path))
        s.listen(1)
    return path


def _live(path: Path, held: list[socket.socket], backlog: int = 8) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(str(path))
    s.listen(backlog)
    held.append(s)
    return path


def _start(root: Path, uid: str | None) -> PluginServer:
    server = PluginServer(DRIVER, root, RecordingDriver(), rolling_update_uid=uid)
    server.start()
    return server


def test_a_new_pod_removes_the_dead_sockets_of_a_killed_one_and_keeps_the_live_ones(
    short_tmp: Path, sockets: list[socket.socket], caplog: pytest.LogCaptureFixture
) -> None:
    registry, plugins = short_tmp / "plugins_registry", short_tmp / "plugins" / DRIVER
    dead_reg = _dead(registry / f"{DRIVER}-{OLD}-reg.sock")
    dead_dra = _dead(plugins / f"dra-{OLD}.sock")
    live_reg = _live(registry / f"{DRIVER}-{LIVE}-reg.sock", sockets)
    live_dra = _live(plugins / f"dra-{LIVE}.sock", sockets)

    caplog.set_level(logging.INFO, logger="kubelet_plugin.stale_sockets")
    server = _start(short_tmp, NEW)
    try:
        assert not dead_reg.exists(), "the killed pod's registration socket is still there"
        assert not dead_dra.exists(), "the killed pod's DRA socket is still there"
        assert live_reg.exists() and live_dra.exists(), "the serving pod's sockets were removed"
        assert Path(server.registration_socket).exists() and Path(server.endpoint).exists()
    finally:
        server.stop(0)
    removed = {
        (r.getMessage(), getattr(r, "driver", None), getattr(r, "path", None))
        for r in caplog.records
    }
    message = "removed stale socket of an earlier plugin instance"
    assert removed == {(message, DRIVER, str(dead_reg)), (message, DRIVER, str(dead_dra))}


def test_hashed_names_of_this_driver_are_removed_those_of_others_kept(short_tmp: Path) -> None:
    registry, plugins = short_tmp / "plugins_registry", short_tmp / "plugins" / DRIVER
    hashed_reg = registration_socket_name(LONG_REGISTRY, DRIVER, OLD)
    hashed_dra = dra_socket_name(LONG_PLUGIN_DIR, OLD)
    assert OLD not in hashed_reg and hashed_reg.startswith(f"{DRIVER}-")
    assert OLD not in hashed_dra
    ours = [_dead(registry / hashed_reg), _dead(plugins / hashed_dra)]
    others = [
        _dead(registry / f"other.example.com-{OLD}-reg.sock"),
        _dead(registry / "other.example.com-reg.sock"),
        # A driver named gpu.tranche.dev-<11 lower-case letters>: the length of a UID
        # hash, but a driver name has no upper-case letter, so it is not ours.
        _dead(registry / f"{DRIVER}-abcdefghijk-reg.sock"),
        _dead(registry / f"{DRIVER}-mig-{OLD}-reg.sock"),
        # The Go helper's shortest form names no driver: it could be anyone's.
        _dead(registry / registration_socket_name(LONG_REGISTRY, "a" * 60 + ".com", OLD)),
        _dead(short_tmp / "plugins" / "other.example.com" / f"dra-{OLD}.sock"),
        _dead(plugins / "checkpoint.sock"),
    ]
    not_a_socket = registry / f"{DRIVER}-{OLD[:-1]}1-reg.sock"
    not_a_socket.write_text("")

    server = _start(short_tmp, NEW)
    server.stop(0)
    assert [p.name for p in ours if p.exists()] == [], "this driver's dead sockets stayed"
    assert [p.name for p in others if not p.exists()] == [], "another's socket was removed"
    assert not_a_socket.exists(), "a file that is not a socket was removed"


def test_a_serving_socket_with_a_full_backlog_is_kept(
    short_tmp: Path, sockets: list[socket.socket]
) -> None:
    """A busy pod (its accept queue full) refuses nothing: connect says EAGAIN."""
    busy = _live(short_tmp / "plugins_registry" / f"{DRIVER}-{LIVE}-reg.sock", sockets, 0)
    filler = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sockets.append(filler)
    filler.connect(str(busy))
    _start(short_tmp, NEW).stop(0)
    assert busy.exists()


def test_without_a_pod_uid_the_dead_per_pod_sockets_go_too(short_tmp: Path) -> None:
    """A plugin that went back to fixed names after per-pod ones leaves none behind."""
    dead_reg = _dead(short_tmp / "plugins_registry" / f"{DRIVER}-{OLD}-reg.sock")
    dead_dra = _dead(short_tmp / "plugins" / DRIVER / f"dra-{OLD}.sock")
    server = _start(short_tmp, None)
    try:
        assert not dead_reg.exists() and not dead_dra.exists(), "per-pod sockets stayed"
        assert Path(server.registration_socket).name == f"{DRIVER}-reg.sock"
    finally:
        server.stop(0)


def test_a_dead_fixed_name_socket_goes_when_the_plugin_runs_per_pod(short_tmp: Path) -> None:
    dead_reg = _dead(short_tmp / "plugins_registry" / f"{DRIVER}-reg.sock")
    dead_dra = _dead(short_tmp / "plugins" / DRIVER / "dra.sock")
    _start(short_tmp, NEW).stop(0)
    assert not dead_reg.exists() and not dead_dra.exists(), "fixed-name sockets stayed"


KILLED_POD = """
import sys, time
from kubelet_plugin.grpc_server import PluginServer
from tests.unit.kubelet_doubles import RecordingDriver
server = PluginServer(sys.argv[1], sys.argv[2], RecordingDriver(), rolling_update_uid=sys.argv[3])
server.start()
print(server.registration_socket, server.endpoint, flush=True)
time.sleep(600)
"""


def _killed_pod(root: Path, uid: str) -> list[Path]:
    """Start a plugin pod's server in a process of its own, SIGKILL it; its socket paths."""
    with subprocess.Popen(
        [sys.executable, "-c", KILLED_POD, DRIVER, str(root), uid],
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO,  # imports tests.unit.kubelet_doubles
    ) as proc:
        try:
            assert proc.stdout is not None
            paths = [Path(p) for p in proc.stdout.readline().split()]
        finally:
            proc.kill()
    assert len(paths) == 2 and all(p.exists() for p in paths), "the kill left both sockets"
    return paths


def test_a_killed_pod_under_a_long_kubelet_root_is_found_by_its_record(short_tmp: Path) -> None:
    """Under a kubelet root of 53 or 54 bytes the registration socket is
    ``dra-<hash of driver and UID>-reg.sock``, which names no driver: the killed pod's record
    in the driver's own directory says it was this driver's."""
    root = short_tmp / ("r" * (54 - len(str(short_tmp)) - 1))
    reg, dra = _killed_pod(root, OLD)
    assert reg.name.startswith("dra-") and DRIVER not in reg.name
    other_name = registration_socket_name(str(reg.parent), "other.example.com", OLD)
    another = _dead(reg.with_name(other_name))
    assert another.name.startswith("dra-")

    server = _start(root, NEW)
    try:
        assert not reg.exists(), "the killed pod's registration socket is still there"
        assert not dra.exists(), "the killed pod's DRA socket is still there"
        assert another.exists(), "another driver's socket was removed"
        assert sorted(p.name for p in dra.parent.glob("*.registration")) == [
            f"{Path(server.endpoint).stem}.registration"
        ], "the killed pod's record stayed, or the new pod wrote none"
    finally:
        server.stop(0)
    assert list(dra.parent.glob("*.registration")) == [], "a clean stop left its record"


def test_a_record_of_a_serving_pod_keeps_it_and_one_naming_no_socket_goes(
    short_tmp: Path, sockets: list[socket.socket]
) -> None:
    plugins = short_tmp / "plugins" / DRIVER
    plugins.mkdir(parents=True)
    serving = _live(short_tmp / "plugins_registry" / "dra-servingservingservin-reg.sock", sockets)
    (plugins / f"dra-{LIVE}.registration").write_text(f"{serving.name}\n")
    outside = _dead(short_tmp / "elsewhere-reg.sock")
    (plugins / f"dra-{OLD}.registration").write_text("../elsewhere-reg.sock\n")

    _start(short_tmp, NEW).stop(0)
    assert serving.exists(), "a serving pod's registration socket was removed"
    assert (plugins / f"dra-{LIVE}.registration").exists(), "a serving pod's record was removed"
    assert outside.exists(), "a record reached outside plugins_registry"
    assert not (plugins / f"dra-{OLD}.registration").exists(), "a bad record stayed"
