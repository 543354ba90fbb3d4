"""Where the HTTP servers listen: ``:PORT`` on every address, IPv4 and IPv6, falling back
to IPv4 where the kernel has no IPv6; an explicit host only there. Real sockets on
loopback."""

from __future__ import annotations

import errno
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler
from typing import Any

import pytest

from driver.flags import parse_address
from driver.http_server import HttpServer
from tests.local_http import LOOPBACKS, NO_IPV6, get, reply, serving


class _Ok(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        reply(self, b"ok\n", "text/plain")

    def log_message(self, format: str, *args: Any) -> None:
        return


@contextmanager
def _listening(address: str) -> Iterator[int]:
    """The port of a server answering on ``address`` (a flag's ``HOST:PORT``)."""
    with serving(HttpServer(parse_address(address, "--health-address"), _Ok)) as server:
        yield server.server_address[1]


def _refused(host: str, port: int) -> bool:
    try:
        get(host, port, "/")
    except ConnectionRefusedError:
        return True
    return False


@pytest.mark.parametrize("client", LOOPBACKS)
def test_a_port_alone_answers_over_ipv4_and_ipv6(client: str) -> None:
    """The chart's ``:9401``: the kubelet probes the pod's primary IP, IPv6 on an IPv6 cluster."""
    with _listening(":0") as port:
        assert get(client, port, "/healthz") == (200, b"ok\n")


@pytest.mark.parametrize(
    ("address", "answers", "refuses"),
    [
        ("0.0.0.0:0", "127.0.0.1", "::1"),
        ("127.0.0.1:0", "127.0.0.1", "::1"),
        ("[::1]:0", "::1", "127.0.0.1"),
    ],
)
@NO_IPV6
def test_an_explicit_host_keeps_its_meaning(address: str, answers: str, refuses: str) -> None:
    with _listening(address) as port:
        assert get(answers, port, "/")[0] == 200
        assert _refused(refuses, port)


class _NoIpv6Socket(socket.socket):
    """A kernel booted with ``ipv6.disable=1``: no IPv6 socket at all."""

    def __init__(self, family: int = -1, *args: Any, **kwargs: Any) -> None:
        if family == socket.AF_INET6:
            raise OSError(errno.EAFNOSUPPORT, "Address family not supported by protocol")
        super().__init__(family, *args, **kwargs)


class _NoIpv6Address(socket.socket):
    """An IPv6 socket that cannot bind: no IPv6 address on the host."""

    def bind(self, address: Any) -> None:
        if self.family == socket.AF_INET6:
            raise OSError(errno.EADDRNOTAVAIL, "Cannot assign requested address")
        super().bind(address)


@pytest.mark.parametrize(
    ("patch", "logged"),
    [
        (("has_ipv6", False), ""),
        (("socket", _NoIpv6Socket), "http server without ipv6 port=0 error=Address family"),
        (("socket", _NoIpv6Address), "http server without ipv6 port=0 error=Cannot assign"),
    ],
    ids=["python-without-ipv6", "kernel-without-ipv6", "no-ipv6-address"],
)
def test_without_ipv6_a_port_alone_listens_on_ipv4(
    patch: tuple[str, object], logged: str, monkeypatch: pytest.MonkeyPatch, caplog: Any
) -> None:
    monkeypatch.setattr(socket, *patch)
    caplog.set_level("INFO", logger="driver.http_server")
    server = HttpServer(parse_address(":0", "--health-address"), _Ok)
    with serving(server):
        assert server.address_family == socket.AF_INET
        assert server.server_address[0] == "0.0.0.0"
        assert get("127.0.0.1", server.server_address[1], "/") == (200, b"ok\n")
    assert logged in caplog.text


def test_a_port_in_use_is_an_error_not_an_ipv4_fallback() -> None:
    with socket.create_server(("0.0.0.0", 0)) as taken:
        port = taken.getsockname()[1]
        with pytest.raises(OSError) as e:
            HttpServer(("", port), _Ok)
    assert e.value.errno == errno.EADDRINUSE
