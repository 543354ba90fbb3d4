"""The plugin's ``/metrics`` and probe endpoints, served over real sockets."""

from __future__ import annotations

import threading
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry, Counter
from prometheus_client.parser import text_string_to_metric_families

from driver.errors import ConfigError
from kubelet_plugin.http_endpoint import HttpEndpoint, Response, listen, metrics_route
from kubelet_plugin.liveness import health_routes
from tests.local_http import LOOPBACKS, get


@pytest.fixture
def registry() -> CollectorRegistry:
    registry = CollectorRegistry()
    Counter("tranche_test_calls", "calls", ["claim"], registry=registry).labels("c1").inc(3)
    return registry


@pytest.fixture
def metrics(registry: CollectorRegistry) -> Iterator[HttpEndpoint]:
    endpoint = HttpEndpoint("127.0.0.1", 0, {"/metrics": metrics_route(registry)}, "m")
    endpoint.start()
    yield endpoint
    endpoint.stop()


def _get(url: str, **headers: str) -> tuple[int, dict[str, str], bytes]:
    request = urllib.request.Request(url, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=5) as answer:
            return answer.status, dict(answer.headers), answer.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def test_a_scrape_that_accepts_gzip_gets_the_plain_page(metrics: HttpEndpoint) -> None:
    status, headers, body = _get(
        f"http://127.0.0.1:{metrics.port}/metrics", **{"Accept-Encoding": "gzip"}
    )
    assert status == 200
    assert "Content-Encoding" not in headers
    assert headers["Content-Type"].startswith("text/plain; version=0.0.4")
    (family,) = [
        f for f in text_string_to_metric_families(body.decode()) if f.name.endswith("calls")
    ]
    assert (family.samples[0].name, family.samples[0].labels, family.samples[0].value) == (
        "tranche_test_calls_total",
        {"claim": "c1"},
        3.0,
    )


def test_openmetrics_when_the_scraper_asks_for_it(metrics: HttpEndpoint) -> None:
    status, headers, body = _get(
        f"http://127.0.0.1:{metrics.port}/metrics",
        Accept="application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5",
    )
    assert status == 200
    assert headers["Content-Type"].startswith("application/openmetrics-text; version=1.0.0")
    assert body.endswith(b"# EOF\n")


def test_a_query_string_does_not_hide_series(metrics: HttpEndpoint) -> None:
    _, _, body = _get(f"http://127.0.0.1:{metrics.port}/metrics?name[]=other")
    assert b'tranche_test_calls_total{claim="c1"} 3.0' in body


def test_other_paths_are_not_found(metrics: HttpEndpoint) -> None:
    assert _get(f"http://127.0.0.1:{metrics.port}/")[0] == 404
    assert _get(f"http://127.0.0.1:{metrics.port}/healthz")[0] == 404


def test_an_ipv6_address_is_served(registry: CollectorRegistry) -> None:
    endpoint = HttpEndpoint("::1", 0, {"/metrics": metrics_route(registry)}, "m6")
    endpoint.start()
    try:
        status, _, body = _get(f"http://[::1]:{endpoint.port}/metrics")
    finally:
        endpoint.stop()
    assert status == 200 and b"tranche_test_calls_total" in body


@pytest.mark.parametrize("client", LOOPBACKS)
def test_a_port_alone_is_served_over_ipv4_and_ipv6(client: str) -> None:
    """The chart's ``--health-address :9401``: the kubelet probes the pod's primary IP, an
    IPv6 address on an IPv6-only or IPv6-primary cluster."""
    routes = health_routes(live=lambda: None, ready=lambda: None)
    endpoint = listen(":0", "--health-address", routes, "h")
    try:
        assert get(client, endpoint.port, "/healthz") == (200, b"ok\n")
    finally:
        endpoint.stop()


def test_probes_answer_each_check() -> None:
    state: dict[str, str | None] = {"live": None, "ready": "slices not published yet"}
    routes = health_routes(live=lambda: state["live"], ready=lambda: state["ready"])
    endpoint = HttpEndpoint("127.0.0.1", 0, routes, "h")
    endpoint.start()
    try:
        url = f"http://127.0.0.1:{endpoint.port}"
        assert _get(f"{url}/healthz")[::2] == (200, b"ok\n")
        assert _get(f"{url}/readyz")[::2] == (503, b"slices not published yet\n")
        state["ready"] = None
        assert _get(f"{url}/readyz")[::2] == (200, b"ok\n")
        state["live"] = "gRPC probe failed: no answer"
        assert _get(f"{url}/healthz")[::2] == (503, b"gRPC probe failed: no answer\n")
        assert _get(f"{url}/readyz")[::2] == (503, b"gRPC probe failed: no answer\n")
    finally:
        endpoint.stop()


def test_a_failing_route_answers_500_and_the_endpoint_keeps_serving(
    caplog: pytest.LogCaptureFixture,
) -> None:
    calls = {"n": 0}

    def flaky(headers: object) -> Response:
        calls["n"] += 1
        if calls["n"] == 1:
            raise ValueError("collector broke")
        return Response(200, "text/plain", b"ok\n")

    endpoint = HttpEndpoint("127.0.0.1", 0, {"/x": flaky}, "f")
    endpoint.start()
    try:
        url = f"http://127.0.0.1:{endpoint.port}/x"
        assert _get(url)[::2] == (500, b"ValueError: collector broke\n")
        assert _get(url)[::2] == (200, b"ok\n")
    finally:
        endpoint.stop()
    assert "http request failed path=/x error=collector broke" in caplog.text


def test_an_address_in_use_is_an_error_naming_the_flag(metrics: HttpEndpoint) -> None:
    with pytest.raises(ConfigError) as e:
        listen(f"127.0.0.1:{metrics.port}", "--health-address", {}, "h")
    assert str(e.value) == (
        f"--health-address: cannot listen on '127.0.0.1:{metrics.port}': Address already in use"
    )


def test_an_unknown_host_is_an_error_naming_the_flag() -> None:
    with pytest.raises(
        ConfigError, match=r"^--metrics-address: cannot listen on 'no-such-host\.invalid:9400': "
    ):
        listen("no-such-host.invalid:9400", "--metrics-address", {}, "m")


def test_listen_serves_at_once(registry: CollectorRegistry) -> None:
    endpoint = listen(
        "127.0.0.1:0", "--metrics-address", {"/metrics": metrics_route(registry)}, "m"
    )
    try:
        assert _get(f"http://127.0.0.1:{endpoint.port}/metrics")[0] == 200
    finally:
        endpoint.stop()


def test_an_endpoint_that_never_started_stops_at_once() -> None:
    endpoint = HttpEndpoint("127.0.0.1", 0, {}, "idle")
    stopper = threading.Thread(target=endpoint.stop, daemon=True)
    stopper.start()
    stopper.join(5)
    assert not stopper.is_alive(), "stop() waits for a server loop that never ran"
