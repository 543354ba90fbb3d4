"""Liveness through the real path: the plugin's own sockets, as the kubelet uses them.

``GET /healthz`` calls ``GetInfo`` on the registration socket and an empty
``NodePrepareResources`` on the DRA socket. A wedged gRPC server, a removed
socket or a dead thread pool fail the probe, which a flag could not show.
``GET /readyz`` additionally needs the ResourceSlices to be published and the kubelet's
registration of this instance (``NotifyRegistrationStatus``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import grpc

from proto.gen.dra.v1 import api_pb2 as dra_v1
from proto.gen.dra.v1 import api_pb2_grpc as dra_v1_grpc
from proto.gen.pluginregistration import api_pb2 as reg
from proto.gen.pluginregistration import api_pb2_grpc as reg_grpc

log = logging.getLogger(__name__)

PROBE_TIMEOUT_S = 3.0


def probe_sockets(registration_socket: str, dra_socket: str, driver_name: str) -> str | None:
    """None when both sockets answer as the kubelet expects, else what is wrong."""
    try:
        with grpc.insecure_channel(f"unix:{registration_socket}") as ch:
            info = reg_grpc.RegistrationStub(ch).GetInfo(reg.InfoRequest(), timeout=PROBE_TIMEOUT_S)
        if info.name != driver_name:
            return f"registration socket answers for driver {info.name!r}, not {driver_name!r}"
        with grpc.insecure_channel(f"unix:{dra_socket}") as ch:
            dra_v1_grpc.DRAPluginStub(ch).NodePrepareResources(
                dra_v1.NodePrepareResourcesRequest(), timeout=PROBE_TIMEOUT_S
            )
    except grpc.RpcError as e:
        return f"gRPC probe failed: {e.code().name}: {e.details()}"
    return None


class HealthEndpoint:
    """``/healthz`` (liveness) and ``/readyz`` (slices published) on ``host:port``."""

    def __init__(
        self,
        host: str,
        port: int,
        live: Callable[[], str | None],
        ready: Callable[[], str | None],
    ) -> None:
        def readiness() -> str | None:
            return live() or ready()

        checks: dict[str, Callable[[], str | None]] = {"/healthz": live, "/readyz": readiness}

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                check = checks.get(self.path)
                if check is None:
                    self.send_error(404)
                    return
                problem = check()
                body = (problem or "ok").encode() + b"\n"
                self.send_response(503 if problem else 200)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                return None

        self._server = ThreadingHTTPServer((host, port), Handler)
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="health-endpoint", daemon=True
        )

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
