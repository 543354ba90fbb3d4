"""The kubelet's side of the plugin gRPC protocol: registration, DRA calls, health stream.

:class:`KubeletStyle` says what a kubelet release understands; :func:`register`
plays the plugin watcher's registration sequence; :class:`PluginConnection`
makes the DRA calls in the negotiated version and returns plain values.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import grpc

from proto.gen.dra.v1 import api_pb2 as dra_v1
from proto.gen.dra.v1 import api_pb2_grpc as dra_v1_grpc
from proto.gen.dra.v1beta1 import api_pb2 as dra_v1beta1
from proto.gen.dra.v1beta1 import api_pb2_grpc as dra_v1beta1_grpc
from proto.gen.drahealth.v1 import api_pb2 as health_v1
from proto.gen.drahealth.v1 import api_pb2_grpc as health_v1_grpc
from proto.gen.drahealth.v1alpha1 import api_pb2 as health_v1alpha1
from proto.gen.drahealth.v1alpha1 import api_pb2_grpc as health_v1alpha1_grpc
from proto.gen.pluginregistration import api_pb2 as reg
from proto.gen.pluginregistration import api_pb2_grpc as reg_grpc

DRA_PLUGIN_TYPE = "DRAPlugin"
GET_INFO_TIMEOUT = 1.0  # the plugin watcher's GetInfo deadline
CALL_TIMEOUT = 45.0  # the kubelet's per-call deadline for NodePrepare/NodeUnprepare


@dataclass(frozen=True)
class KubeletStyle:
    """What one kubelet release speaks.

    ``dra_services``: DRAPlugin versions it understands; it takes the first entry
    of the *plugin's* list that it knows. ``health_services``: health versions in
    the kubelet's preference order. ``health_if_advertised``: 1.37 opens the
    stream only for an advertised service; 1.34 - 1.36 open v1alpha1 unasked.
    """

    name: str
    dra_services: tuple[str, ...]
    health_services: tuple[str, ...]
    health_if_advertised: bool


STYLES = {
    "1.33": KubeletStyle("1.33", ("v1beta1.DRAPlugin",), (), health_if_advertised=True),
    "1.34": KubeletStyle(
        "1.34",
        ("v1.DRAPlugin", "v1beta1.DRAPlugin"),
        ("v1alpha1.DRAResourceHealth",),
        health_if_advertised=False,
    ),
    "1.37": KubeletStyle(
        "1.37",
        ("v1.DRAPlugin", "v1beta1.DRAPlugin"),
        ("v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth"),
        health_if_advertised=True,
    ),
}


class RegistrationRejectedError(Exception):
    """The plugin's GetInfo answer is unusable; the plugin was told why."""


@dataclass(frozen=True)
class Registration:
    driver: str
    endpoint: str
    registration_socket: str
    supported_versions: tuple[str, ...]
    dra_service: str
    health_service: str  # "" when the kubelet opens no health stream


@dataclass(frozen=True)
class ClaimRequest:
    namespace: str
    uid: str
    name: str


@dataclass(frozen=True)
class DeviceAnswer:
    request_names: tuple[str, ...]
    pool_name: str
    device_name: str
    cdi_device_ids: tuple[str, ...]
    share_id: str | None


@dataclass(frozen=True)
class PrepareAnswer:
    devices: tuple[DeviceAnswer, ...]
    error: str


@dataclass(frozen=True)
class HealthEntry:
    pool_name: str
    device_name: str
    health: str  # "Healthy" | "Unhealthy" | "Unknown"
    message: str
    timeout_seconds: int
    last_updated_time: int


_HEALTH_NAMES = {0: "Unknown", 1: "Healthy", 2: "Unhealthy"}


def choose_services(style: KubeletStyle, info: reg.PluginInfo) -> tuple[str, str]:
    """(DRA service, health service or "") as the kubelet of ``style`` picks them."""
    offered = list(info.supported_versions)
    dra = next((s for s in offered if s in style.dra_services), "")
    if not dra:
        raise RegistrationRejectedError(
            f"none of the services supported by the plugin ({offered}) are supported "
            f"by the kubelet ({list(style.dra_services)})"
        )
    if style.health_if_advertised:
        health = next((s for s in style.health_services if s in offered), "")
    else:
        health = style.health_services[0] if style.health_services else ""
    return dra, health


def register(
    style: KubeletStyle, registration_socket: str, timeout: float = GET_INFO_TIMEOUT
) -> Registration:
    """GetInfo, validate, NotifyRegistrationStatus; raises RegistrationRejectedError on refusal.

    ``timeout``: each call's deadline, the kubelet's 1 s by default; a test that registers
    once, with no retry, passes a longer one so that a stalled machine does not fail it."""
    with grpc.insecure_channel(f"unix:{registration_socket}") as channel:
        stub = reg_grpc.RegistrationStub(channel)
        info = stub.GetInfo(reg.InfoRequest(), timeout=timeout)
        try:
            if info.type != DRA_PLUGIN_TYPE:
                raise RegistrationRejectedError(
                    f"plugin type {info.type!r} is not {DRA_PLUGIN_TYPE!r}"
                )
            if not info.name:
                raise RegistrationRejectedError("PluginInfo.name is empty")
            endpoint = info.endpoint or registration_socket
            if not endpoint.startswith("/"):
                raise RegistrationRejectedError(f"PluginInfo.endpoint {endpoint!r} is not absolute")
            dra, health = choose_services(style, info)
        except RegistrationRejectedError as rejected:
            stub.NotifyRegistrationStatus(
                reg.RegistrationStatus(plugin_registered=False, error=str(rejected)),
                timeout=timeout,
            )
            raise
        stub.NotifyRegistrationStatus(
            reg.RegistrationStatus(plugin_registered=True), timeout=timeout
        )
    return Registration(
        driver=info.name,
        endpoint=endpoint,
        registration_socket=registration_socket,
        supported_versions=tuple(info.supported_versions),
        dra_service=dra,
        health_service=health,
    )


class PluginConnection:
    """A channel to one registered plugin, speaking its negotiated versions."""

    def __init__(self, registration: Registration) -> None:
        self.registration = registration
        self._channel = grpc.insecure_channel(f"unix:{registration.endpoint}")
        self._pb: Any
        self._stub: Any
        if registration.dra_service == "v1.DRAPlugin":
            self._pb, self._stub = dra_v1, dra_v1_grpc.DRAPluginStub(self._channel)
        else:
            self._pb, self._stub = dra_v1beta1, dra_v1beta1_grpc.DRAPluginStub(self._channel)

    def close(self) -> None:
        self._channel.close()

    def _claims(self, claims: Sequence[ClaimRequest]) -> list[Any]:
        return [self._pb.Claim(namespace=c.namespace, uid=c.uid, name=c.name) for c in claims]

    def prepare(self, claims: Sequence[ClaimRequest]) -> dict[str, PrepareAnswer]:
        request = self._pb.NodePrepareResourcesRequest(claims=self._claims(claims))
        response = self._stub.NodePrepareResources(request, timeout=CALL_TIMEOUT)
        answers: dict[str, PrepareAnswer] = {}
        for uid, entry in response.claims.items():
            devices = tuple(
                DeviceAnswer(
                    request_names=tuple(d.request_names),
                    pool_name=d.pool_name,
                    device_name=d.device_name,
                    cdi_device_ids=tuple(d.cdi_device_ids),
                    share_id=d.share_id if self._pb is dra_v1 and d.HasField("share_id") else None,
                )
                for d in entry.devices
            )
            answers[uid] = PrepareAnswer(devices=devices, error=entry.error)
        return answers

    def unprepare(self, claims: Sequence[ClaimRequest]) -> dict[str, str]:
        """Claim UID → error ("" on success)."""
        request = self._pb.NodeUnprepareResourcesRequest(claims=self._claims(claims))
        response = self._stub.NodeUnprepareResources(request, timeout=CALL_TIMEOUT)
        return {uid: entry.error for uid, entry in response.claims.items()}

    def watch_health(self) -> tuple[Any, Iterator[tuple[HealthEntry, ...]]]:
        """Open the negotiated health stream: (call to cancel it, iterator of device lists)."""
        call: Any
        if self.registration.health_service == "v1.DRAResourceHealth":
            call = health_v1_grpc.DRAResourceHealthStub(self._channel).NodeWatchResources(
                health_v1.NodeWatchResourcesRequest()
            )
        else:
            call = health_v1alpha1_grpc.DRAResourceHealthStub(self._channel).NodeWatchResources(
                health_v1alpha1.NodeWatchResourcesRequest()
            )

        def updates() -> Iterator[tuple[HealthEntry, ...]]:
            for message in call:
                yield tuple(
                    HealthEntry(
                        pool_name=d.device.pool_name,
                        device_name=d.device.device_name,
                        health=_HEALTH_NAMES.get(d.health, "Unknown"),
                        message=d.message,
                        timeout_seconds=d.health_check_timeout_seconds,
                        last_updated_time=d.last_updated_time,
                    )
                    for d in message.devices
                )

        return call, updates()
