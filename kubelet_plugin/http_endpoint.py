"""The plugin's HTTP endpoints: ``/metrics`` and the health probes, each on its own port.

One small server class serves both (``http.server``, a thread per request). ``/metrics`` is
prometheus-client's exposition (the text format, or OpenMetrics when the scraper asks for
it), sent **uncompressed** even to a scraper that accepts gzip: compressing the ~30 KiB page
allocated zlib's 256 KiB of state per scrape and left the idle plugin 0.3-0.6 MiB larger
(``docs/performance.md``, ninth round), while the page crosses the node's loopback or pod
network once every scrape interval. The query string (prometheus-client's ``name[]``
filter) is ignored: every scrape gets every series.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from email.message import Message
from http.server import BaseHTTPRequestHandler
from typing import NamedTuple
from urllib.parse import urlsplit

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

from driver.errors import ConfigError
from driver.flags import parse_address
from driver.http_server import HttpServer

log = logging.getLogger(__name__)


class Response(NamedTuple):
    status: int
    content_type: str
    body: bytes


Route = Callable[[Message], Response]  # the request's headers → the answer


def metrics_route(registry: CollectorRegistry) -> Route:
    """``/metrics``: every series of ``registry`` in the format the scraper accepts."""

    def page(headers: Message) -> Response:
        encode, content_type = choose_encoder(headers.get("Accept", ""))
        return Response(200, content_type, encode(registry))

    return page


class HttpEndpoint:
    """GET ``routes`` on ``host:port`` (an IPv6 host too; ``""`` every address, IPv4 and
    IPv6: ``driver.http_server``); anything else is 404."""

    def __init__(self, host: str, port: int, routes: Mapping[str, Route], name: str) -> None:
        routes = dict(routes)

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                route = routes.get(urlsplit(self.path).path)
                if route is None:
                    self.send_error(404)
                    return
                try:
                    answer = route(self.headers)
                except Exception as e:  # a failing collector or check must not end the endpoint
                    log.exception("http request failed path=%s error=%s", self.path, e)
                    answer = Response(500, "text/plain", f"{type(e).__name__}: {e}\n".encode())
                self.send_response(answer.status)
                self.send_header("Content-Type", answer.content_type)
                self.send_header("Content-Length", str(len(answer.body)))
                self.end_headers()
                self.wfile.write(answer.body)

            def log_message(self, format: str, *args: object) -> None:
                return None  # probes and scrapes every few seconds are not news

        self._server = HttpServer((host, port), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, name=name, daemon=True)

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        if self._thread.is_alive():  # shutdown() waits for serve_forever, which never ran
            self._server.shutdown()
        self._server.server_close()


def listen(address: str, flag: str, routes: Mapping[str, Route], name: str) -> HttpEndpoint:
    """An endpoint serving ``routes`` on ``address`` (``flag``'s ``HOST:PORT``), started. An
    address it cannot listen on (in use, an unknown host) is a ConfigError naming the flag."""
    host, port = parse_address(address, flag)
    try:
        endpoint = HttpEndpoint(host, port, routes, name)
    except OSError as e:
        raise ConfigError(f"{flag}: cannot listen on {address!r}: {e.strerror or e}") from e
    endpoint.start()
    return endpoint
