"""The kubelet's DRA resource health service (KEP-4680), v1 and v1alpha1.

``NodeWatchResources`` streams the complete device list of the driver: once when
the stream opens, after every change the :class:`~driver.api.HealthSource`
reports, and again every ``resend_seconds`` (10 s) while nothing changes. The
kubelet marks a device ``Unknown`` when no message named it within its health
timeout (30 s unless the message sets one), so a list sent only on change turned
every healthy device ``Unknown`` half a minute after the plugin started. Each
entry declares ``health_check_timeout_seconds`` (the device's own, else 60 s,
six re-sends), so one slow re-send never flips a device.

A 1.37 kubelet opens the stream only when the plugin advertises ``v1.DRAResourceHealth``
or ``v1alpha1.DRAResourceHealth`` (it prefers v1); a 1.34 - 1.36 kubelet opens v1alpha1
unasked. Both are served on the DRA socket.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import grpc

from driver.api import HealthSnapshot, HealthSource
from proto.gen.drahealth.v1 import api_pb2 as h1
from proto.gen.drahealth.v1 import api_pb2_grpc as h1_grpc
from proto.gen.drahealth.v1alpha1 import api_pb2 as h1a1
from proto.gen.drahealth.v1alpha1 import api_pb2_grpc as h1a1_grpc

log = logging.getLogger(__name__)

HEALTH_SERVICE_V1 = "v1.DRAResourceHealth"
HEALTH_SERVICE_V1ALPHA1 = "v1alpha1.DRAResourceHealth"

RESEND_SECONDS = 10.0  # the whole list again at least this often
DEFAULT_TIMEOUT_SECONDS = 60  # declared for a device that names no timeout of its own
MESSAGE_LIMIT = 1024  # the kubelet truncates longer messages to 1021 characters plus "..."
_STATES = {"Healthy": 1, "Unhealthy": 2}  # anything else is UNKNOWN (0)


def truncate_message(message: str) -> str:
    if len(message) <= MESSAGE_LIMIT:
        return message
    return message[: MESSAGE_LIMIT - 3] + "..."


def to_response(pb: Any, snapshot: HealthSnapshot, now: float) -> Any:
    """The snapshot as a ``NodeWatchResourcesResponse`` of the module ``pb``."""
    response = pb.NodeWatchResourcesResponse()
    for device in snapshot.devices:
        entry = response.devices.add()
        entry.device.pool_name = device.pool_name
        entry.device.device_name = device.device_name
        entry.health = _STATES.get(device.health, 0)
        entry.last_updated_time = int(now)
        entry.health_check_timeout_seconds = (
            device.timeout_seconds if device.timeout_seconds > 0 else DEFAULT_TIMEOUT_SECONDS
        )
        entry.message = truncate_message(device.message)
    return response


class _Streamer:
    """Yields the snapshot, then every changed snapshot and a re-send every ``resend_seconds``
    while nothing changed, until the client or the server stops."""

    def __init__(
        self,
        source: HealthSource,
        stopping: threading.Event,
        clock: Callable[[], float],
        poll_seconds: float,
        resend_seconds: float,
    ) -> None:
        self._source = source
        self._stopping = stopping
        self._clock = clock
        self._poll = poll_seconds
        self._resend = resend_seconds

    def stream(self, pb: Any, version: str, context: grpc.ServicerContext) -> Iterator[Any]:
        peer = context.peer()
        log.info("health stream opened version=%s peer=%s", version, peer)
        current = self._source.snapshot()
        sent = 0
        try:
            yield to_response(pb, current, self._clock())
            sent += 1
            last_sent = time.monotonic()
            while context.is_active() and not self._stopping.is_set():
                nxt = self._source.wait_for_change(current, self._poll)
                if nxt != current or time.monotonic() - last_sent >= self._resend:
                    current = nxt
                    yield to_response(pb, current, self._clock())
                    sent += 1
                    last_sent = time.monotonic()
        finally:
            log.info("health stream closed version=%s peer=%s messages=%d", version, peer, sent)


class HealthServicerV1(h1_grpc.DRAResourceHealthServicer):
    def __init__(self, streamer: _Streamer) -> None:
        self._streamer = streamer

    def NodeWatchResources(  # noqa: N802 (gRPC method name)
        self, request: h1.NodeWatchResourcesRequest, context: grpc.ServicerContext
    ) -> Iterator[h1.NodeWatchResourcesResponse]:
        return self._streamer.stream(h1, HEALTH_SERVICE_V1, context)


class HealthServicerV1alpha1(h1a1_grpc.DRAResourceHealthServicer):
    def __init__(self, streamer: _Streamer) -> None:
        self._streamer = streamer

    def NodeWatchResources(  # noqa: N802 (gRPC method name)
        self, request: h1a1.NodeWatchResourcesRequest, context: grpc.ServicerContext
    ) -> Iterator[h1a1.NodeWatchResourcesResponse]:
        return self._streamer.stream(h1a1, HEALTH_SERVICE_V1ALPHA1, context)


def add_health_services(
    server: grpc.Server,
    source: HealthSource,
    stopping: threading.Event,
    *,
    clock: Callable[[], float] = time.time,
    poll_seconds: float = 0.5,
    resend_seconds: float = RESEND_SECONDS,
) -> list[str]:
    """Register v1 and v1alpha1 on ``server``; returns their ``supported_versions`` strings.

    ``stopping`` ends open streams (within ``poll_seconds``) when the server shuts down.
    """
    streamer = _Streamer(source, stopping, clock, min(poll_seconds, resend_seconds), resend_seconds)
    h1_grpc.add_DRAResourceHealthServicer_to_server(HealthServicerV1(streamer), server)
    h1a1_grpc.add_DRAResourceHealthServicer_to_server(HealthServicerV1alpha1(streamer), server)
    return [HEALTH_SERVICE_V1, HEALTH_SERVICE_V1ALPHA1]
