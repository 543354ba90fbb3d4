"""The benchmarks' kubelet client (``hack/kubeletclient``, grpc-go with the upstream
``k8s.io/kubelet`` stubs) against a DRA server of ours: it makes the calls the kubelet
makes, in the modes the benchmark asks for, and fails loudly on a claim's error."""

from __future__ import annotations

import functools
import shutil
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest

from hack.bench import go_driver, go_kubelet
from hack.kubeletsim.client import ClaimRequest
from proto.gen.dra.v1 import api_pb2 as pb
from proto.gen.dra.v1 import api_pb2_grpc as pb_grpc
from tests.conftest import unavailable


@functools.cache
def _client() -> Path:
    if shutil.which("go") is None:
        unavailable("'go' is not on PATH: the kubelet client cannot be built", "go")
    try:
        return go_kubelet.build()
    except RuntimeError as e:
        unavailable(str(e), "the kubelet client")


class _Plugin(pb_grpc.DRAPluginServicer):
    """Records each call's claims and the most calls it had in flight at once."""

    def __init__(self, delay_s: float = 0.0, failing: str = "") -> None:
        self.calls: list[tuple[str, tuple[tuple[str, str, str], ...]]] = []
        self.in_flight = 0
        self.most_in_flight = 0
        self._lock = threading.Lock()
        self._delay_s = delay_s
        self._failing = failing

    def _enter(self, method: str, claims: Any) -> None:
        with self._lock:
            self.calls.append((method, tuple((c.namespace, c.name, c.uid) for c in claims)))
            self.in_flight += 1
            self.most_in_flight = max(self.most_in_flight, self.in_flight)
        time.sleep(self._delay_s)
        with self._lock:
            self.in_flight -= 1

    def NodePrepareResources(self, request: Any, context: Any) -> Any:
        self._enter("prepare", request.claims)
        response = pb.NodePrepareResourcesResponse()
        for c in request.claims:
            response.claims[c.uid].error = "no such device" if c.uid == self._failing else ""
        return response

    def NodeUnprepareResources(self, request: Any, context: Any) -> Any:
        self._enter("unprepare", request.claims)
        response = pb.NodeUnprepareResourcesResponse()
        for c in request.claims:
            response.claims[c.uid].error = ""
        return response


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Any]:
    servers: list[grpc.Server] = []

    def start(plugin: _Plugin) -> str:
        socket = str(tmp_path / f"dra-{len(servers)}.sock")
        server = grpc.server(futures.ThreadPoolExecutor(16))
        pb_grpc.add_DRAPluginServicer_to_server(plugin, server)
        server.add_insecure_port(f"unix://{socket}")
        server.start()
        servers.append(server)
        return socket

    yield start
    for server in servers:
        server.stop(0)


def _claims(n: int) -> list[ClaimRequest]:
    return [ClaimRequest(namespace="team-a", uid=f"uid-{i}", name=f"claim-{i}") for i in range(n)]


def test_single_prepares_then_unprepares_one_claim_and_times_only_the_measured_rounds(
    serve: Any,
) -> None:
    plugin = _Plugin()
    (claim,) = _claims(1)
    calls = go_kubelet.call(_client(), serve(plugin), "single", [claim], warmup=2, rounds=3)
    ref = (("team-a", "claim-0", "uid-0"),)
    assert plugin.calls == [("prepare", ref), ("unprepare", ref)] * 5  # warm-up included
    assert len(calls.prepare) == len(calls.unprepare) == 3
    assert all(s > 0 for s in calls.prepare + calls.unprepare)


def test_a_burst_makes_one_call_per_claim_with_the_asked_calls_in_flight(serve: Any) -> None:
    plugin = _Plugin(delay_s=0.05)
    claims = _claims(12)
    calls = go_kubelet.call(_client(), serve(plugin), "burst", claims, concurrency=4)
    prepared = [c[1] for c in plugin.calls if c[0] == "prepare"]
    unprepared = [c[1] for c in plugin.calls if c[0] == "unprepare"]
    every = sorted((("team-a", c.name, c.uid),) for c in claims)
    assert sorted(prepared) == sorted(unprepared) == every  # one claim per call, each once
    assert plugin.calls.index(("unprepare", unprepared[0])) >= 12  # after every prepare
    assert plugin.most_in_flight == 4
    assert len(calls.prepare) == 12
    assert calls.prepare_wall >= 3 * 0.05  # 12 calls of 50 ms, 4 at a time


def test_a_call_with_no_claims_is_an_empty_unprepare(serve: Any) -> None:
    plugin = _Plugin()
    calls = go_kubelet.call(_client(), serve(plugin), "empty", warmup=1, rounds=4)
    assert plugin.calls == [("unprepare", ())] * 5
    assert len(calls.unprepare) == 4


def test_a_claim_answered_with_an_error_fails_the_run_naming_the_claim(serve: Any) -> None:
    plugin = _Plugin(failing="uid-1")
    with pytest.raises(
        RuntimeError, match=r"NodePrepareResources team-a/claim-1: .*no such device"
    ):
        go_kubelet.call(_client(), serve(plugin), "burst", _claims(3), concurrency=1)


def test_a_plugin_that_is_not_there_fails_the_run(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="NodeUnprepareResources"):
        go_kubelet.call(_client(), str(tmp_path / "none.sock"), "empty", rounds=1, timeout_s=120)


def test_two_drivers_measured_side_by_side_alternate_in_parts(serve: Any) -> None:
    """The benchmark's Go driver and Tranche take turns (hack.bench.go_driver.alternated), so
    a slow minute falls on both; Tranche's part is followed by its settling."""
    order: list[str] = []

    class Logged(_Plugin):
        def __init__(self, tag: str) -> None:
            super().__init__()
            self.tag = tag

        def _enter(self, method: str, claims: Any) -> None:
            order.append(self.tag)
            super()._enter(method, claims)

    ours, theirs = _claims(2)
    mine, peer = Logged("tranche"), Logged("go")
    got_mine, got_peer = go_driver.alternated(
        _client(),
        (serve(mine), ours),
        (serve(peer), theirs),
        "single",
        warmup=1,
        rounds=8,
        settle=lambda: order.append("settle"),
    )
    runs = [tag for i, tag in enumerate(order) if i == 0 or order[i - 1] != tag]
    assert runs == ["tranche", "settle", "go"] * go_driver.CHUNKS
    assert {c[1][0][2] for c in mine.calls} == {ours.uid}
    assert {c[1][0][2] for c in peer.calls} == {theirs.uid}
    assert len(got_mine.prepare) == len(got_peer.prepare) == 8
    assert len(got_mine.unprepare) == len(got_peer.unprepare) == 8
