"""The health endpoint's calls on the plugin's own sockets, against the real gRPC servers."""

from __future__ import annotations

import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from kubelet_plugin import liveness, socket_probe
from kubelet_plugin.grpc_server import PluginServer
from kubelet_plugin.liveness import GET_INFO, PREPARE, probe_sockets
from proto.gen.dra.v1 import api_pb2 as dra_v1
from proto.gen.dra.v1 import api_pb2_grpc as dra_v1_grpc
from proto.gen.pluginregistration import api_pb2 as reg
from tests.unit.kubelet_doubles import RecordingDriver

DRIVER = "gpu.tranche.dev"


@pytest.fixture
def driver() -> RecordingDriver:
    return RecordingDriver()


@pytest.fixture
def server(driver: RecordingDriver) -> Iterator[PluginServer]:
    root = Path(tempfile.mkdtemp(prefix="sp", dir="/tmp"))
    srv = PluginServer(DRIVER, root, driver, max_workers=1)
    srv.start()
    yield srv
    driver.block.set()
    srv.stop(grace=1)
    shutil.rmtree(root, ignore_errors=True)


def test_get_info_answers_what_the_kubelet_reads(server: PluginServer) -> None:
    info = socket_probe.call(
        server.registration_socket, GET_INFO, reg.InfoRequest(), reg.PluginInfo, 3
    )
    assert (info.name, info.endpoint) == (DRIVER, server.endpoint)
    assert "v1.DRAPlugin" in info.supported_versions


def test_a_healthy_plugin_passes(server: PluginServer) -> None:
    assert probe_sockets(server.registration_socket, server.endpoint, DRIVER) is None


def test_a_socket_of_another_driver_fails(server: PluginServer) -> None:
    problem = probe_sockets(server.registration_socket, server.endpoint, "other.example.com")
    assert problem == (
        "registration socket answers for driver 'gpu.tranche.dev', not 'other.example.com'"
    )


def test_a_removed_socket_fails_naming_it(server: PluginServer) -> None:
    Path(server.endpoint).unlink()
    problem = probe_sockets(server.registration_socket, server.endpoint, DRIVER)
    assert problem is not None
    assert server.endpoint in problem and "No such file or directory" in problem


def test_a_wedged_thread_pool_fails(server: PluginServer, driver: RecordingDriver) -> None:
    # The one worker is held by a prepare that does not return; the probe's call waits for a
    # worker like the kubelet's next call would, and gives up at its deadline.
    driver.block.clear()
    busy = threading.Thread(target=_prepare_one_claim, args=(server.endpoint,), daemon=True)
    busy.start()
    assert driver.entered.wait(5)
    with pytest.raises(socket_probe.ProbeError, match=r"no answer within 0.5 s"):
        socket_probe.call(
            server.endpoint,
            PREPARE,
            dra_v1.NodePrepareResourcesRequest(),
            dra_v1.NodePrepareResourcesResponse,
            0.5,
        )
    driver.block.set()
    busy.join(5)
    assert probe_sockets(server.registration_socket, server.endpoint, DRIVER) is None


def _hold_the_one_worker(server: PluginServer, driver: RecordingDriver) -> threading.Thread:
    driver.block.clear()
    busy = threading.Thread(target=_prepare_one_claim, args=(server.endpoint,), daemon=True)
    busy.start()
    assert driver.entered.wait(5)
    return busy


def test_a_thread_pool_busy_with_the_kubelets_calls_passes(
    server: PluginServer, driver: RecordingDriver, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A burst of prepares (one at a time under the node lock) keeps every thread busy for
    # longer than the probe waits; three failed probes in a row would restart the plugin
    # in the middle of the burst.
    monkeypatch.setattr(liveness, "PROBE_TIMEOUT_S", 0.5)
    busy = _hold_the_one_worker(server, driver)
    assert (
        probe_sockets(server.registration_socket, server.endpoint, DRIVER, server.oldest_call_s)
        is None
    )
    driver.block.set()
    busy.join(5)


def test_a_call_in_progress_past_the_kubelets_deadline_fails(
    server: PluginServer, driver: RecordingDriver, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(liveness, "PROBE_TIMEOUT_S", 0.5)
    monkeypatch.setattr(liveness, "STUCK_S", 0.2)
    busy = _hold_the_one_worker(server, driver)
    problem = probe_sockets(
        server.registration_socket, server.endpoint, DRIVER, server.oldest_call_s
    )
    assert problem is not None
    assert "no answer within 0.5 s; a call in progress has run" in problem
    driver.block.set()
    busy.join(5)
    assert server.oldest_call_s() is None


def test_a_failed_call_is_not_taken_for_an_answer(server: PluginServer) -> None:
    with pytest.raises(socket_probe.ProbeError, match="ended without an answer"):
        socket_probe.call(
            server.endpoint,
            "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NoSuchMethod",
            dra_v1.NodePrepareResourcesRequest(),
            dra_v1.NodePrepareResourcesResponse,
            3,
        )


def test_long_header_values_are_encoded_as_the_server_decodes_them(server: PluginServer) -> None:
    # Values over 126 bytes need HPACK's multi-byte length; a wrong one garbles the header
    # block and the server answers with an error instead of the plugin's information.
    frames = socket_probe._request_frames(
        GET_INFO, reg.InfoRequest().SerializeToString(), ((b"x-padding", b"p" * 200),)
    )
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(3)
        sock.connect(server.registration_socket)
        sock.sendall(frames)
        body = socket_probe._read_answer(sock, time.monotonic() + 3)
    assert body is not None
    assert reg.PluginInfo.FromString(body[5:]).name == DRIVER


def _probe_one_shot_server(path: str, answer: bytes, match: str) -> None:
    """Probe a socket whose server reads the request, sends ``answer`` (maybe nothing) and
    hangs up; the probe must fail with a message matching ``match``."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        listener.bind(path)
        listener.listen(1)

        def serve_once() -> None:
            conn, _ = listener.accept()
            conn.recv(4096)
            if answer:
                conn.sendall(answer)
            conn.close()

        threading.Thread(target=serve_once, daemon=True).start()
        with pytest.raises(socket_probe.ProbeError, match=match):
            socket_probe.call(path, GET_INFO, reg.InfoRequest(), reg.PluginInfo, 3)


def test_a_server_that_hangs_up_fails(tmp_path: Path) -> None:
    _probe_one_shot_server(str(tmp_path / "s.sock"), b"", "closed the connection before")


def test_an_answer_that_is_not_the_message_fails(tmp_path: Path) -> None:
    # Another program on the socket, answering with a gRPC frame that is not a PluginInfo.
    garbage = b"\xff\xff\xff"
    data = b"\x00" + len(garbage).to_bytes(4, "big") + garbage
    answer = socket_probe._frame(socket_probe.DATA, socket_probe.END_STREAM, 1, data)
    _probe_one_shot_server(str(tmp_path / "s.sock"), answer, "the answer is not a PluginInfo")


def test_hpack_integers_follow_rfc_7541() -> None:
    # RFC 7541 C.1: 10 fits the prefix; 1337 with a 5-bit prefix is 31, 154, 10 (here 7 bits).
    assert socket_probe._integer(10) == bytes([10])
    assert socket_probe._integer(126) == bytes([126])
    assert socket_probe._integer(127) == bytes([127, 0])
    assert socket_probe._integer(1337) == bytes([127, 186, 9])


def _prepare_one_claim(endpoint: str) -> None:
    request = dra_v1.NodePrepareResourcesRequest(
        claims=[dra_v1.Claim(namespace="ns", uid="uid-1", name="c1")]
    )
    with grpc.insecure_channel(f"unix:{endpoint}") as ch:
        dra_v1_grpc.DRAPluginStub(ch).NodePrepareResources(request, timeout=30)
