"""Liveness through the real path: the plugin's own sockets, as the kubelet uses them.

``GET /healthz`` calls ``GetInfo`` on the registration socket and an empty
``NodePrepareResources`` on the DRA socket (plain HTTP/2 frames: ``socket_probe``). A
wedged gRPC server, a removed socket or a dead thread pool fail the probe, which a flag
could not show. The empty call waits for a thread like any kubelet call: behind a burst
of prepares (claims are prepared one at a time) it gets no answer in time from a server
that is only busy, so a timeout while every call in progress is younger than the
kubelet's own deadline (``STUCK_S``) passes; a call older than that fails it.
``GET /readyz`` additionally needs the ResourceSlices to be published and the kubelet's
registration of this instance (``NotifyRegistrationStatus``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from email.message import Message

from kubelet_plugin import socket_probe
from kubelet_plugin.http_endpoint import Response, Route
from proto.gen.dra.v1 import api_pb2 as dra_v1
from proto.gen.pluginregistration import api_pb2 as reg

log = logging.getLogger(__name__)

Check = Callable[[], str | None]  # None when all is well, else the reason

PROBE_TIMEOUT_S = 3.0
# The kubelet gives up a DRA call after 45 s (defaultClientCallTimeout): a call in progress
# for longer is stuck, not busy.
STUCK_S = 45.0
GET_INFO = "/" + reg.DESCRIPTOR.services_by_name["Registration"].full_name + "/GetInfo"
PREPARE = "/" + dra_v1.DESCRIPTOR.services_by_name["DRAPlugin"].full_name + "/NodePrepareResources"


def probe_sockets(
    registration_socket: str,
    dra_socket: str,
    driver_name: str,
    oldest_call_s: Callable[[], float | None] = lambda: None,
) -> str | None:
    """None when both sockets answer as the kubelet expects, else what is wrong.
    ``oldest_call_s``: how long the oldest DRA call in progress has run (None: none is)."""
    try:
        info = socket_probe.call(
            registration_socket, GET_INFO, reg.InfoRequest(), reg.PluginInfo, PROBE_TIMEOUT_S
        )
        if info.name != driver_name:
            return f"registration socket answers for driver {info.name!r}, not {driver_name!r}"
        socket_probe.call(
            dra_socket,
            PREPARE,
            dra_v1.NodePrepareResourcesRequest(),
            dra_v1.NodePrepareResourcesResponse,
            PROBE_TIMEOUT_S,
        )
    except socket_probe.ProbeTimeout as e:
        oldest = oldest_call_s()
        if oldest is None:
            return f"gRPC probe failed: {e}"
        if oldest >= STUCK_S:
            return f"gRPC probe failed: {e}; a call in progress has run {oldest:.0f} s"
        log.info(
            "liveness probe waits behind calls in progress endpoint=%s oldest_call_s=%.1f",
            dra_socket,
            oldest,
        )
    except socket_probe.ProbeError as e:
        return f"gRPC probe failed: {e}"
    return None


def health_routes(live: Check, ready: Check) -> dict[str, Route]:
    """``/healthz`` answers ``live``; ``/readyz`` answers ``live`` and then ``ready``. A
    check returns None when all is well, else the reason, sent with status 503."""

    def answer(check: Check) -> Route:
        def route(headers: Message) -> Response:
            problem = check()
            return Response(
                503 if problem else 200, "text/plain", (problem or "ok").encode() + b"\n"
            )

        return route

    return {"/healthz": answer(live), "/readyz": answer(lambda: live() or ready())}
