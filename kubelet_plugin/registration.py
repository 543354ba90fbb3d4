"""The kubelet plugin registration service (``pluginregistration.Registration``).

The kubelet finds the registration socket in ``<kubelet root>/plugins_registry``,
calls ``GetInfo`` and reports the outcome with ``NotifyRegistrationStatus``.
``GetInfo`` is cheap and answers the same at any time.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass

import grpc

from proto.gen.pluginregistration import api_pb2 as reg
from proto.gen.pluginregistration import api_pb2_grpc as reg_grpc

log = logging.getLogger(__name__)

DRA_PLUGIN_TYPE = "DRAPlugin"


@dataclass(frozen=True)
class RegistrationStatus:
    """What the kubelet last told the plugin about its registration."""

    registered: bool
    error: str = ""


class RegistrationState:
    """Thread-safe record of the kubelet's registration notifications."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._history: list[RegistrationStatus] = []

    def record(self, status: RegistrationStatus) -> None:
        with self._cond:
            self._history.append(status)
            self._cond.notify_all()

    @property
    def latest(self) -> RegistrationStatus | None:
        with self._cond:
            return self._history[-1] if self._history else None

    @property
    def history(self) -> tuple[RegistrationStatus, ...]:
        with self._cond:
            return tuple(self._history)

    def wait(self, timeout: float) -> RegistrationStatus | None:
        """Block until the kubelet has sent a status (or ``timeout`` passes); return the latest."""
        with self._cond:
            self._cond.wait_for(lambda: bool(self._history), timeout)
            return self._history[-1] if self._history else None


class RegistrationServicer(reg_grpc.RegistrationServicer):
    def __init__(
        self,
        driver_name: str,
        endpoint: str,
        supported_versions: Sequence[str],
        state: RegistrationState,
    ) -> None:
        self._info = reg.PluginInfo(
            type=DRA_PLUGIN_TYPE,
            name=driver_name,
            endpoint=endpoint,
            supported_versions=list(supported_versions),
        )
        self._state = state

    def GetInfo(  # noqa: N802 (gRPC method name)
        self, request: reg.InfoRequest, context: grpc.ServicerContext
    ) -> reg.PluginInfo:
        log.debug(
            "registration GetInfo driver=%s endpoint=%s", self._info.name, self._info.endpoint
        )
        info = reg.PluginInfo()
        info.CopyFrom(self._info)
        return info

    def NotifyRegistrationStatus(  # noqa: N802 (gRPC method name)
        self, request: reg.RegistrationStatus, context: grpc.ServicerContext
    ) -> reg.RegistrationStatusResponse:
        status = RegistrationStatus(registered=request.plugin_registered, error=request.error)
        self._state.record(status)
        if status.registered:
            log.info(
                "registered with the kubelet driver=%s endpoint=%s",
                self._info.name,
                self._info.endpoint,
            )
        else:
            log.error(
                "kubelet rejected the registration driver=%s endpoint=%s error=%s",
                self._info.name,
                self._info.endpoint,
                status.error,
            )
        return reg.RegistrationStatusResponse()
