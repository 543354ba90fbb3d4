"""A minimal DRA kubelet plugin for infrastructure tests of real nodes (not Tranche's driver).

It proves the path kubelet -> DRA plugin -> containerd CDI injection on a real node without
the driver under test: the kubelet finds its registration socket in
``<kubelet root>/plugins_registry``, calls ``NodePrepareResources`` over the v1 DRA service,
and the plugin answers with CDI device IDs that name a CDI spec the test wrote by hand into
the node's CDI directory. Every claim gets the same device list; nothing is allocated here
(the scheduler allocates from a ResourceSlice the test publishes).
"""

from __future__ import annotations

import logging
import threading
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from proto.gen.dra.v1 import api_pb2 as dra
from proto.gen.dra.v1 import api_pb2_grpc as dra_grpc
from proto.gen.pluginregistration import api_pb2 as reg
from proto.gen.pluginregistration import api_pb2_grpc as reg_grpc

log = logging.getLogger(__name__)


@dataclass
class PluginCalls:
    """What the kubelet asked, for assertions."""

    prepared: list[str] = field(default_factory=list)  # claim UIDs
    unprepared: list[str] = field(default_factory=list)
    registered: threading.Event = field(default_factory=threading.Event)
    registration_error: str = ""


class _Registration(reg_grpc.RegistrationServicer):
    def __init__(self, driver: str, endpoint: str, calls: PluginCalls) -> None:
        self._info = reg.PluginInfo(
            type="DRAPlugin", name=driver, endpoint=endpoint, supported_versions=["v1.DRAPlugin"]
        )
        self._calls = calls

    def GetInfo(self, request: reg.InfoRequest, context: grpc.ServicerContext) -> reg.PluginInfo:
        return self._info

    def NotifyRegistrationStatus(
        self, request: reg.RegistrationStatus, context: grpc.ServicerContext
    ) -> reg.RegistrationStatusResponse:
        self._calls.registration_error = request.error
        if request.plugin_registered:
            self._calls.registered.set()
        log.info(
            "cdi test plugin registration registered=%s error=%r",
            request.plugin_registered,
            request.error,
        )
        return reg.RegistrationStatusResponse()


class _Dra(dra_grpc.DRAPluginServicer):
    def __init__(self, pool: str, devices: dict[str, list[str]], calls: PluginCalls) -> None:
        self._pool = pool
        self._devices = devices  # device name -> CDI device IDs
        self._calls = calls

    def NodePrepareResources(
        self, request: dra.NodePrepareResourcesRequest, context: grpc.ServicerContext
    ) -> dra.NodePrepareResourcesResponse:
        resp = dra.NodePrepareResourcesResponse()
        for claim in request.claims:
            self._calls.prepared.append(claim.uid)
            devices = [
                dra.Device(
                    request_names=["gpu"],
                    pool_name=self._pool,
                    device_name=name,
                    cdi_device_ids=ids,
                )
                for name, ids in sorted(self._devices.items())
            ]
            resp.claims[claim.uid].CopyFrom(dra.NodePrepareResourceResponse(devices=devices))
            log.info("cdi test plugin prepared claim=%s/%s", claim.namespace, claim.name)
        return resp

    def NodeUnprepareResources(
        self, request: dra.NodeUnprepareResourcesRequest, context: grpc.ServicerContext
    ) -> dra.NodeUnprepareResourcesResponse:
        resp = dra.NodeUnprepareResourcesResponse()
        for claim in request.claims:
            self._calls.unprepared.append(claim.uid)
            resp.claims[claim.uid].CopyFrom(dra.NodeUnprepareResourceResponse())
        return resp


class CdiTestPlugin:
    """Serve registration and DRA v1 for ``driver`` under ``kubelet_root``; ``stop()`` ends it."""

    def __init__(
        self, kubelet_root: Path, driver: str, pool: str, devices: dict[str, list[str]]
    ) -> None:
        self.registration_socket = kubelet_root / "plugins_registry" / f"{driver}-reg.sock"
        self.dra_socket = kubelet_root / "plugins" / driver / "dra.sock"
        self.calls = PluginCalls()
        self._dra = grpc.server(futures.ThreadPoolExecutor(4))
        dra_grpc.add_DRAPluginServicer_to_server(_Dra(pool, devices, self.calls), self._dra)
        self._reg = grpc.server(futures.ThreadPoolExecutor(2))
        reg_grpc.add_RegistrationServicer_to_server(
            _Registration(driver, str(self.dra_socket), self.calls), self._reg
        )

    def start(self) -> None:
        self.dra_socket.parent.mkdir(parents=True, exist_ok=True)
        self.registration_socket.parent.mkdir(parents=True, exist_ok=True)
        self._dra.add_insecure_port(f"unix://{self.dra_socket}")
        self._dra.start()
        # The registration socket last: the kubelet calls GetInfo as soon as it appears.
        self._reg.add_insecure_port(f"unix://{self.registration_socket}")
        self._reg.start()

    def stop(self) -> None:
        self._reg.stop(0).wait()
        self.registration_socket.unlink(missing_ok=True)
        self._dra.stop(1).wait()
        self.dra_socket.unlink(missing_ok=True)
