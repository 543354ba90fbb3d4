"""``tranche controller``: the cluster-side process (a Deployment).

Every replica serves the legacy-resource webhook (when enabled) with the
certificate from the TLS Secret. The replica holding the Lease also writes:
it creates and renews that Secret, keeps ``caBundle`` current, and deletes
this driver's ResourceSlices whose node is gone. ``/healthz`` says the loop is
alive, ``/readyz`` that the webhook has a certificate to serve.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import logging
import signal
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from typing import Any

from kubernetes import client
from prometheus_client import CollectorRegistry, MetricsHandler

from controller.leader import LeaderElector, LeaseConfig
from controller.metrics import ControllerMetrics
from controller.settings import (
    ControllerSettings,
    add_arguments,
    settings_from_args,
)
from controller.slice_gc import collect_orphaned_slices
from controller.webhook.certs import CertPolicy
from controller.webhook.server import WebhookServer
from controller.webhook.tls import WebhookTls
from driver.cli import Command
from driver.errors import ConfigError, TrancheError
from driver.flags import named, parse_address
from driver.http_server import HttpServer
from driver.kube.client import api_client
from driver.startup_gc import collect_startup_garbage

log = logging.getLogger(__name__)


class Controller:
    """The controller's loops and servers; ``start``/``stop`` or ``run_once`` in tests."""

    def __init__(self, settings: ControllerSettings, api: client.ApiClient) -> None:
        self.settings = settings
        self.api = api
        self.metrics = ControllerMetrics()
        self.elector = LeaderElector(
            api,
            LeaseConfig(settings.namespace, settings.lease_name, settings.identity),
            on_change=lambda leader: self.metrics.leader.set(1 if leader else 0),
        )
        self.tls: WebhookTls | None = None
        self.webhook: WebhookServer | None = None
        if settings.legacy_webhook:
            policy = CertPolicy(
                dns_names=settings.webhook_dns_names,
                ip_addresses=settings.webhook_ip_sans,
                ca_validity=dt.timedelta(days=settings.ca_validity_days),
                cert_validity=dt.timedelta(days=settings.cert_validity_days),
            )
            self.tls = WebhookTls(
                api,
                settings.namespace,
                settings.tls_secret,
                webhook_configs=(settings.webhook_config,),
                policy=policy,
            )
            host, port = parse_address(settings.webhook_address, "--webhook-address")
            with _listening(settings.webhook_address, "--webhook-address"):
                self.webhook = WebhookServer(host, port, self.tls, api, self.metrics)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_gc = float("-inf")
        self.last_pass = 0.0  # monotonic time of the last finished pass (liveness)

    def ready(self) -> bool:
        return self.tls is None or self.tls.context() is not None

    def alive(self) -> bool:
        return time.monotonic() - self.last_pass < 3 * self.settings.sync_interval_s + 30

    def run_once(self, leader: bool | None = None) -> None:
        """One pass of every loop; ``leader`` overrides the elector (tests)."""
        is_leader = self.elector.is_leader if leader is None else leader
        leading = (lambda: self.elector.is_leader) if leader is None else (lambda: leader)
        if self.tls is not None:
            try:
                outcome = self.tls.sync(may_write=is_leader)
                if outcome.startswith("rotated"):
                    self.metrics.cert_rotations.inc()
                bundle = self.tls.bundle
                if bundle is not None:
                    expiry = bundle.serving_cert().not_valid_after_utc.timestamp()
                    self.metrics.cert_expiry.set(expiry)
            except TrancheError as e:
                self.metrics.loop_errors.labels(loop="certificates").inc()
                log.warning("certificate sync failed error=%s", e)
            except Exception:
                self.metrics.loop_errors.labels(loop="certificates").inc()
                log.exception("certificate sync failed unexpectedly")
        interval = self.settings.slice_gc_interval_s
        now = time.monotonic()
        if is_leader and interval > 0 and now - self._last_gc >= interval:
            self._last_gc = now
            try:
                result = collect_orphaned_slices(self.api, self.settings.driver_name, leading)
                self.metrics.slices_deleted.inc(len(result.deleted))
            except TrancheError as e:
                self.metrics.loop_errors.labels(loop="slice-gc").inc()
                log.warning("slice clean-up failed error=%s", e)
            except Exception:
                self.metrics.loop_errors.labels(loop="slice-gc").inc()
                log.exception("slice clean-up failed unexpectedly")
        self.last_pass = time.monotonic()

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.run_once()
            self._stop.wait(min(self.settings.sync_interval_s, 2.0) if not self.ready() else
                            self.settings.sync_interval_s)  # fmt: skip

    def start(self, elect: bool = True) -> None:
        if elect:
            self.elector.start()
        if self.tls is not None:
            self.run_once()
        if self.webhook is not None:
            self.webhook.start()
        self._thread = threading.Thread(target=self._loop, name="controller-loop", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        if self.webhook is not None:
            self.webhook.stop()
        self.elector.stop()


@contextlib.contextmanager
def _listening(address: str, flag: str) -> Iterator[None]:
    """An address a server cannot listen on (in use, unknown) is a ConfigError naming ``flag``."""
    try:
        yield
    except OSError as e:
        raise ConfigError(f"{named(flag)}: cannot listen on {address!r}: {e.strerror or e}") from e


def _serve(server: HttpServer, name: str) -> HttpServer:
    threading.Thread(target=server.serve_forever, name=name, daemon=True).start()
    return server


def _health_server(address: str, controller: Controller) -> HttpServer:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            checks = {"/healthz": controller.alive, "/readyz": controller.ready}
            check = checks.get(self.path)
            if check is None:
                self.send_error(404)
                return
            ok = check()
            body = b"ok\n" if ok else b"not ready\n"
            self.send_response(200 if ok else 503)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            return

    with _listening(address, "--health-address"):
        server = HttpServer(parse_address(address, "--health-address"), Handler)
    return _serve(server, "health")


def _metrics_server(address: str, registry: CollectorRegistry) -> HttpServer:
    handler = MetricsHandler.factory(registry)
    with _listening(address, "--metrics-address"):
        server = HttpServer(parse_address(address, "--metrics-address"), handler)
    return _serve(server, "metrics")


def run(args: argparse.Namespace) -> int:
    try:
        settings = settings_from_args(args)
        logging.basicConfig(
            level=settings.log_level,
            format="time=%(asctime)s level=%(levelname)s logger=%(name)s msg=%(message)s",
        )
        api = api_client(settings.kubeconfig)
        controller = Controller(settings, api)
        if settings.metrics_address:
            _metrics_server(settings.metrics_address, controller.metrics.registry)
        health = (
            _health_server(settings.health_address, controller) if settings.health_address else None
        )
    except TrancheError as e:
        log.error("controller cannot start error=%s", e)
        print(f"tranche controller: {e}", file=sys.stderr)
        return 2
    log.info(
        "controller starting identity=%s namespace=%s legacy_webhook=%s",
        settings.identity, settings.namespace, settings.legacy_webhook,
    )  # fmt: skip
    controller.start()
    collect_startup_garbage()  # what the imports left, frozen by driver.cli (startup_gc.py)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda _s, _f: stop.set())
    stop.wait()
    log.info("controller stopping")
    controller.stop()
    if health is not None:
        health.shutdown()
    return 0


command = Command(
    help=(
        "Run the cluster controller: legacy-resource webhook and its TLS, slice clean-up "
        "(leader-elected)."
    ),
    add_arguments=add_arguments,
    run=run,
)
