"""A leader whose renew request hangs stops acting at the renew deadline, before another
replica may take the lease, and not when the request finally returns.

The API server is canned at the transport (``controller.kube_client.send``): it keeps one
Lease, and once ``hang`` is set its lease requests wait until ``release`` is set, as a
request to a stalled API server waits for its timeout. The clock is the test's.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any, cast

import pytest
from kubernetes import client

from controller.leader import LeaderElector, LeaseConfig
from controller.main import Controller
from controller.settings import ControllerSettings
from driver.kube.http import RawAnswer

WAIT_S = 30  # a bound on waiting for the election thread, not a timing the test relies on
SLICES = [
    {"metadata": {"name": f"gone-{i}-gpu", "uid": f"u{i}"},
     "spec": {"driver": "gpu.tranche.dev", "nodeName": f"gone-{i}"}}
    for i in range(3)
]  # fmt: skip


class StalledApi:
    """One Lease and this driver's slices; lease requests wait while ``hang`` is set."""

    def __init__(self) -> None:
        self.now = 0.0
        self.lease: dict[str, Any] | None = None
        self.hang = threading.Event()
        self.waiting = threading.Event()
        self.release = threading.Event()
        self.hung_timeouts: list[float] = []
        self.deleted: list[str] = []
        self.delete_takes_s = 0.0

    def clock(self) -> float:
        return self.now

    def send(self, _api: Any, method: str, path: str, **kw: Any) -> RawAnswer:
        if "/leases" in path:
            return self._lease(method, kw.get("body"), kw.get("timeout_s", 30.0))
        if method == "DELETE":
            self.deleted.append(path.rsplit("/", 1)[-1])
            self.now += self.delete_takes_s
            return RawAnswer(200, "OK", b"{}")
        if path.endswith("/resourceslices"):
            return RawAnswer(200, "OK", json.dumps({"items": SLICES}).encode())
        if path == "/api/v1/nodes":
            return RawAnswer(200, "OK", b'{"items": []}')
        raise AssertionError(f"unexpected request {method} {path}")

    def _lease(self, method: str, body: Any, timeout_s: float) -> RawAnswer:
        if self.hang.is_set():
            self.hung_timeouts.append(timeout_s)
            self.waiting.set()
            self.release.wait(WAIT_S)
        if method == "GET":
            if self.lease is None:
                return RawAnswer(404, "Not Found", b"{}")
            return RawAnswer(200, "OK", json.dumps(self.lease).encode())
        self.lease = body
        return RawAnswer(200, "OK", json.dumps(body).encode())


@pytest.fixture
def stalled(monkeypatch: pytest.MonkeyPatch) -> StalledApi:
    api = StalledApi()
    monkeypatch.setattr("controller.kube_client.send", api.send)
    return api


@pytest.fixture
def elector(stalled: StalledApi) -> Iterator[LeaderElector]:
    config = LeaseConfig("tranche", "l", "replica-1", retry_period_s=0.01)
    elector = LeaderElector(cast(client.ApiClient, object()), config, clock=stalled.clock)
    elector.start()
    try:
        yield elector
    finally:
        stalled.hang.clear()
        stalled.release.set()
        elector.stop()


def _renew_hangs(stalled: StalledApi, elector: LeaderElector) -> None:
    """The elector leads at t=0, then its next lease request waits on the API server."""
    assert _eventually(lambda: elector.is_leader)
    stalled.hang.set()
    assert stalled.waiting.wait(WAIT_S)


def _eventually(check: Any) -> bool:
    done = threading.Event()
    for _ in range(WAIT_S * 100):
        if check():
            return True
        done.wait(0.01)
    return False


def test_a_hung_renew_ends_leadership_at_the_renew_deadline(
    stalled: StalledApi, elector: LeaderElector
) -> None:
    _renew_hangs(stalled, elector)
    stalled.now = 9.0
    assert elector.is_leader
    stalled.now = 10.5  # past the renew deadline (10 s), the request still waiting
    assert not elector.is_leader
    # The request may wait no longer than the renew deadline, not send's 30 s.
    assert stalled.hung_timeouts and max(stalled.hung_timeouts) <= 10.0


def test_slice_clean_up_stops_deleting_when_leadership_lapses_mid_pass(
    stalled: StalledApi, elector: LeaderElector
) -> None:
    _renew_hangs(stalled, elector)
    stalled.delete_takes_s = 6.0  # the second delete ends past the renew deadline
    settings = ControllerSettings(namespace="tranche", identity="replica-1")
    controller = Controller(settings, cast(client.ApiClient, object()))
    controller.elector = elector
    controller.run_once()
    assert stalled.deleted == ["gone-0-gpu", "gone-1-gpu"]
    deleted = controller.metrics.registry.get_sample_value("tranche_slice_gc_deleted_total")
    assert deleted == 2.0
