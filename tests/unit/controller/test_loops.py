"""The controller's loops survive answers that are not the API server's: a proxy in
front of it answering its own HTML page names the request and is counted, and the
loops go on."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from kubernetes import client

from controller.kube_client import ApiCallError, request
from controller.leader import LeaderElector, LeaseConfig
from controller.main import Controller
from controller.settings import ControllerSettings
from tests.local_http import reply, serving


class _Proxy(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _HtmlPage)
        self.requests = 0
        self.seen = threading.Condition()


class _HtmlPage(BaseHTTPRequestHandler):
    server: _Proxy

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(length)
        reply(self, b"<html><body>Sign in to continue</body></html>", "text/html")
        with self.server.seen:
            self.server.requests += 1
            self.server.seen.notify_all()

    def do_GET(self) -> None:
        self._answer()

    def do_POST(self) -> None:
        self._answer()

    def do_PUT(self) -> None:
        self._answer()

    def do_DELETE(self) -> None:
        self._answer()

    def log_message(self, format: str, *args: Any) -> None:
        return


@pytest.fixture
def proxy() -> Iterator[_Proxy]:
    with serving(_Proxy()) as server:
        yield server


@pytest.fixture
def api(proxy: _Proxy) -> Iterator[client.ApiClient]:
    cfg = client.Configuration()
    cfg.host = f"http://127.0.0.1:{proxy.server_address[1]}"
    with client.ApiClient(cfg) as api:
        yield api


def test_an_answer_that_is_not_json_names_the_request(api: client.ApiClient) -> None:
    with pytest.raises(ApiCallError, match=r"^read lease tranche/l: the answer is not JSON"):
        request(api, "read lease tranche/l", "GET", "/apis/coordination.k8s.io/v1/x")


def test_the_controller_pass_counts_the_failures_and_returns(api: client.ApiClient) -> None:
    settings = ControllerSettings(
        namespace="tranche",
        identity="replica-1",
        legacy_webhook=True,
        webhook_address="127.0.0.1:0",
    )
    controller = Controller(settings, api)
    try:
        controller.run_once(leader=True)
        errors = controller.metrics.registry.get_sample_value
        for loop in ("certificates", "slice-gc"):
            assert errors("tranche_controller_loop_errors_total", {"loop": loop}) == 1.0
        assert controller.alive()
        assert not controller.ready()
    finally:
        controller.stop()


def test_the_election_keeps_trying_and_does_not_lead(api: client.ApiClient, proxy: _Proxy) -> None:
    elector = LeaderElector(api, LeaseConfig("tranche", "l", "replica-1", retry_period_s=0.01))
    elector.start()
    try:
        with proxy.seen:
            assert proxy.seen.wait_for(lambda: proxy.requests >= 3, timeout=60)
        assert elector.running()
        assert not elector.is_leader
    finally:
        elector.stop()
