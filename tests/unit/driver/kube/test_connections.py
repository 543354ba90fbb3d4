"""The plugin client's connections on a local HTTP server: a server URL's path prefix,
kept-alive connections reused, at most ``size`` kept idle."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from driver.kube.http import KubeClient
from driver.kube.kubeconfig import Credentials
from tests.local_http import reply, serving


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.connections = 0
        self.paths: list[str] = []
        self.gate = threading.Barrier(1)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive
    server: _Server

    def setup(self) -> None:
        super().setup()
        self.server.connections += 1

    def do_GET(self) -> None:
        self.server.paths.append(self.path)
        self.server.gate.wait(30)
        reply(self, b'{"kind": "Status", "message": "ok"}')

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[_Server]:
    with serving(_Server()) as srv:
        yield srv


def test_requests_go_under_the_servers_path_on_one_kept_alive_connection(
    server: _Server,
) -> None:
    url = f"http://127.0.0.1:{server.server_address[1]}/k8s/clusters/c-1/"
    with KubeClient(Credentials(url)) as kube:
        for _ in range(5):
            assert kube.request("GET", "/api/v1/nodes", query={"limit": "1"})["message"] == "ok"
    assert server.paths == ["/k8s/clusters/c-1/api/v1/nodes?limit=1"] * 5
    assert server.connections == 1


def test_calls_in_flight_beyond_the_pool_size_open_connections_not_kept(
    server: _Server,
) -> None:
    url = f"http://127.0.0.1:{server.server_address[1]}"
    with KubeClient(Credentials(url), pool_size=2) as kube:
        for expected in (4, 6):  # the second round reuses the two kept and opens two
            server.gate = threading.Barrier(4)  # four requests answered only together
            with ThreadPoolExecutor(4) as pool:
                list(pool.map(lambda _: kube.request("GET", "/version"), range(4)))
            assert server.connections == expected
