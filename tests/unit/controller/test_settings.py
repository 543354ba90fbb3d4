"""A bad ``tranche controller`` setting stops it with one message naming the flag."""

from __future__ import annotations

import argparse
import http.client
import socket
from pathlib import Path
from types import SimpleNamespace

import pytest
from prometheus_client import CollectorRegistry, Counter

from controller.main import _health_server, _metrics_server, run
from controller.settings import add_arguments
from tests.local_http import LOOPBACKS, get


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["--sync-interval", "abc"], "--sync-interval"),
        (["--slice-gc-interval", "soon"], "--slice-gc-interval"),
        (["--cert-validity-days", "1.5"], "--cert-validity-days"),
        (["--ca-validity-days", "x"], "--ca-validity-days"),
        (["--sync-interval", "0"], "--sync-interval [env TRANCHE_SYNC_INTERVAL]"),
        # a busy loop against the API server
        (["--sync-interval", "1e-9"], "--sync-interval [env TRANCHE_SYNC_INTERVAL]"),
        (["--slice-gc-interval", "0.001"], "--slice-gc-interval [env TRANCHE_SLICE_GC_INTERVAL]"),
        (["--driver-name", "gpu tranche"], "--driver-name [env TRANCHE_DRIVER_NAME]"),
        (["--lease-name", ""], "--lease-name [env TRANCHE_LEASE_NAME]"),
        (["--tls-secret", ""], "--tls-secret [env TRANCHE_TLS_SECRET]"),
        (["--webhook-config", "Legacy_GPU"], "--webhook-config [env TRANCHE_WEBHOOK_CONFIG]"),
        (["--webhook-service", "s" * 254], "--webhook-service [env TRANCHE_WEBHOOK_SERVICE]"),
    ],
)
def test_a_bad_value_names_the_flag(
    argv: list[str], flag: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TRANCHE_SYNC_INTERVAL", raising=False)
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert run(parser.parse_args(["--namespace", "tranche", *argv])) == 2
    err = capsys.readouterr().err
    assert err.startswith("tranche controller: invalid setting: ")
    assert not err.startswith("tranche controller: tranche controller:")
    assert flag in err


def test_an_empty_lease_name_from_the_environment_is_refused_at_start(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An empty name would make every replica write the Lease collection: none would lead."""
    monkeypatch.setenv("TRANCHE_LEASE_NAME", "")
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert run(parser.parse_args(["--namespace", "tranche"])) == 2
    assert "--lease-name [env TRANCHE_LEASE_NAME]: '' is not an object name" in (
        capsys.readouterr().err
    )


def _kubeconfig(tmp_path: Path) -> Path:
    path = tmp_path / "kubeconfig"
    path.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "clusters: [{name: c, cluster: {server: 'http://127.0.0.1:1'}}]\n"
        "users: [{name: u, user: {token: t}}]\n"
        "contexts: [{name: c, context: {cluster: c, user: u}}]\n"
    )
    return path


def test_an_address_in_use_stops_the_controller_naming_the_flag(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    with socket.create_server(("127.0.0.1", 0)) as taken:
        address = f"127.0.0.1:{taken.getsockname()[1]}"
        argv = ["--namespace", "tranche", "--kubeconfig", str(_kubeconfig(tmp_path)),
                "--health-address", "", "--metrics-address", address]  # fmt: skip
        assert run(parser.parse_args(argv)) == 2
    err = capsys.readouterr().err
    assert err.startswith("tranche controller: --metrics-address [env TRANCHE_METRICS_ADDRESS]: ")
    assert f"cannot listen on {address!r}" in err


def test_health_and_readiness_answer_on_an_ipv6_address() -> None:
    """An IPv6 host in brackets is served: ``--health-address [::1]:8081``."""
    replica = SimpleNamespace(alive=lambda: True, ready=lambda: False)
    server = _health_server("[::1]:0", replica)  # type: ignore[arg-type]
    try:
        conn = http.client.HTTPConnection("::1", server.server_address[1], timeout=10)
        conn.request("GET", "/healthz")
        assert conn.getresponse().status == 200
        conn.close()
        conn = http.client.HTTPConnection("::1", server.server_address[1], timeout=10)
        conn.request("GET", "/readyz")
        assert conn.getresponse().status == 503
        conn.close()
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("client", LOOPBACKS)
def test_the_chart_addresses_answer_over_ipv4_and_ipv6(client: str) -> None:
    """The chart's ``:8081`` and ``:9090``: the kubelet probes the pod's primary IP and
    Prometheus scrapes it, an IPv6 address on an IPv6-only or IPv6-primary cluster."""
    replica = SimpleNamespace(alive=lambda: True, ready=lambda: True)
    registry = CollectorRegistry()
    Counter("tranche_controller_test", "a series", registry=registry).inc()
    health = _health_server(":0", replica)  # type: ignore[arg-type]
    metrics = _metrics_server(":0", registry)
    try:
        assert get(client, health.server_address[1], "/readyz") == (200, b"ok\n")
        status, page = get(client, metrics.server_address[1], "/metrics")
        assert status == 200 and b"tranche_controller_test_total 1.0" in page
    finally:
        for server in (health, metrics):
            server.shutdown()
            server.server_close()
