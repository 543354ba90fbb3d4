"""Socket lifecycle of the kubelet plugin: DRA socket first, registration socket last.

Layout (as the Go helper ``k8s.io/dynamic-resource-allocation/kubeletplugin``)::

    <kubelet root>/plugins/<driver>/dra.sock             DRA v1 + v1beta1, health v1 + v1alpha1
    <kubelet root>/plugins_registry/<driver>-reg.sock    pluginregistration.Registration

With rolling updates (two plugin pods of one node serving at once) both names
carry the pod UID: ``dra-<uid>.sock`` and ``<driver>-<uid>-reg.sock``; where
a path would be too long, a hash of the UID replaces it, for the registration
socket as the Go helper does (:func:`registration_socket_name`), for the DRA
socket likewise (:func:`dra_socket_name`; the kubelet learns its path from the
registration).

``start()`` removes the sockets of earlier instances that nobody serves
(:mod:`kubelet_plugin.stale_sockets`), replaces its own stale ones, serves DRA, then
opens the registration socket.

``stop(grace, drain)`` first lets the DRA calls in progress finish (within
``grace`` seconds) while the instance is still registered: the kubelet closes its
connection when it deregisters an instance, and a call still running on it fails.
Then the registration socket goes, and DRA keeps serving until the kubelet has
closed its connection, for at most ``drain`` seconds: the kubelet notices the
removal in its plugin manager's next round (once a second), and until then may
still send this instance a call, which a server already shutting down would refuse
(a failed prepare, retried a minute later). Then health streams end, calls that
came meanwhile finish within ``grace`` seconds, and the DRA socket goes.
"""

from __future__ import annotations

import base64
import hashlib
import logging
import stat
import threading
import time
from concurrent import futures
from pathlib import Path

import grpc

from driver.api import DraDriver, HealthSource
from driver.errors import ConfigError
from kubelet_plugin.grpc_dra import add_dra_services
from kubelet_plugin.health_service import RESEND_SECONDS, add_health_services
from kubelet_plugin.in_flight import InFlight
from kubelet_plugin.registration import RegistrationServicer, RegistrationState
from kubelet_plugin.settings import DRA_WORKERS
from kubelet_plugin.stale_sockets import record_path, remove_stale_sockets, write_record
from kubelet_plugin.unix_peers import connected_peers
from proto.gen.pluginregistration import api_pb2_grpc as reg_grpc

log = logging.getLogger(__name__)

# gRPC needs the path plus a terminating NUL in sockaddr_un.sun_path (108 bytes).
UNIX_PATH_MAX = 107
# How long a stopping plugin waits, at most, for the kubelet to drop its connection after the
# registration socket is gone: the kubelet's plugin manager looks once a second.
DRAIN_S = 3.0
DRAIN_POLL_S = 0.05


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def registration_socket_name(registry_dir: str, driver_name: str, pod_uid: str | None) -> str:
    """Basename of the registration socket, as the Go helper picks it.

    Without rolling updates ``<driver>-reg.sock``; with them the first that fits:
    ``<driver>-<uid>-reg.sock``, ``<driver>-<b64(sha256(uid))[:8 bytes]>-reg.sock``,
    ``dra-<b64(sha256(driver NUL uid))[:16 bytes]>-reg.sock``.
    """
    if not pod_uid:
        return f"{driver_name}-reg.sock"
    uid_hash = hashlib.sha256(pod_uid.encode()).digest()
    pair_hash = hashlib.sha256(f"{driver_name}\x00{pod_uid}".encode()).digest()
    candidates = [
        f"{driver_name}-{pod_uid}-reg.sock",
        f"{driver_name}-{_b64(uid_hash[:8])}-reg.sock",
        f"dra-{_b64(pair_hash[:16])}-reg.sock",
    ]
    for name in candidates:
        if len(str(Path(registry_dir) / name).encode()) <= UNIX_PATH_MAX:
            return name
    return candidates[-1]


def dra_socket_name(plugin_dir: str, pod_uid: str | None) -> str:
    """Basename of the DRA socket: ``dra.sock``; with rolling updates ``dra-<uid>.sock``, or
    ``dra-<b64(sha256(uid))[:12 bytes]>.sock`` where the UID would make the path too long
    (a long kubelet root dir or driver name)."""
    if not pod_uid:
        return "dra.sock"
    full = f"dra-{pod_uid}.sock"
    if len(str(Path(plugin_dir) / full).encode()) <= UNIX_PATH_MAX:
        return full
    return f"dra-{_b64(hashlib.sha256(pod_uid.encode()).digest()[:12])}.sock"


def _prepare_socket_path(path: Path, flag: str) -> None:
    """Create the directory and remove a stale socket; refuse what is not ours to remove."""
    if len(str(path).encode()) > UNIX_PATH_MAX:
        raise ConfigError(
            f"{flag}: socket path {path} is {len(str(path).encode())} bytes; "
            f"Unix sockets allow at most {UNIX_PATH_MAX}"
        )
    path.parent.mkdir(mode=0o750, parents=True, exist_ok=True)
    try:
        mode = path.lstat().st_mode
    except FileNotFoundError:
        return
    if stat.S_ISDIR(mode):
        raise ConfigError(f"{flag}: {path} is a directory, not a socket")
    log.info("removing stale socket path=%s", path)
    path.unlink()


def _identity(path: Path) -> tuple[int, int] | None:
    try:
        st = path.lstat()
    except FileNotFoundError:
        return None
    return (st.st_dev, st.st_ino)


class _Socket:
    """One gRPC server on one Unix socket, removed on stop only if it is still ours."""

    def __init__(self, path: Path, server: grpc.Server) -> None:
        self.path = path
        self.server = server
        self._identity: tuple[int, int] | None = None

    def start(self) -> None:
        self.server.add_insecure_port(f"unix:{self.path}")
        self.server.start()
        self._identity = _identity(self.path)

    def stop(self, grace: float) -> None:
        self.server.stop(grace).wait()
        if self._identity is not None and _identity(self.path) == self._identity:
            self.path.unlink(missing_ok=True)
        self._identity = None


class PluginServer:
    """The kubelet-facing gRPC servers of one plugin instance."""

    def __init__(
        self,
        driver_name: str,
        kubelet_root: str | Path,
        dra: DraDriver,
        *,
        health: HealthSource | None = None,
        rolling_update_uid: str | None = None,
        max_workers: int = DRA_WORKERS,  # --grpc-workers (kubelet_plugin.settings)
        health_resend_seconds: float = RESEND_SECONDS,
    ) -> None:
        root = Path(kubelet_root).absolute()
        registry_dir = root / "plugins_registry"
        self.driver_name = driver_name
        self.plugin_data_dir = root / "plugins" / driver_name
        self._dra_path = self.plugin_data_dir / dra_socket_name(
            str(self.plugin_data_dir), rolling_update_uid
        )
        self._registry_dir = registry_dir
        self._rolling_update = bool(rolling_update_uid)
        self._reg_path = registry_dir / registration_socket_name(
            str(registry_dir), driver_name, rolling_update_uid
        )
        self._dra = dra
        self._health = health
        self._max_workers = max_workers
        self._health_resend = health_resend_seconds
        self._stopping = threading.Event()
        self._in_flight = InFlight()
        self._lock = threading.Lock()
        self._sockets: list[_Socket] = []
        self.registration = RegistrationState()
        self.supported_versions: tuple[str, ...] = ()

    @property
    def endpoint(self) -> str:
        """Absolute path of the DRA service socket (``PluginInfo.endpoint``)."""
        return str(self._dra_path)

    @property
    def registration_socket(self) -> str:
        return str(self._reg_path)

    def oldest_call_s(self) -> float | None:
        """Seconds the longest-running DRA call in progress has run; None when none is."""
        return self._in_flight.oldest_s()

    def start(self) -> None:
        with self._lock:
            if self._sockets:
                return
            self._stopping.clear()
            remove_stale_sockets(
                self.driver_name,
                self._registry_dir,
                self.plugin_data_dir,
                keep={self._dra_path, self._reg_path},
            )
            _prepare_socket_path(self._dra_path, "--kubelet-root/--driver-name (DRA socket)")
            _prepare_socket_path(self._reg_path, "--kubelet-root/--driver-name (registration)")
            dra_server = grpc.server(
                futures.ThreadPoolExecutor(self._max_workers, thread_name_prefix="dra-grpc")
            )
            versions = add_dra_services(dra_server, self._dra, self._in_flight)
            if self._health is not None:
                versions += add_health_services(
                    dra_server,
                    self._health,
                    self._stopping,
                    resend_seconds=self._health_resend,
                )
            self.supported_versions = tuple(versions)
            dra_socket = _Socket(self._dra_path, dra_server)
            dra_socket.start()
            self._sockets.append(dra_socket)

            reg_server = grpc.server(
                futures.ThreadPoolExecutor(2, thread_name_prefix="registration-grpc")
            )
            reg_grpc.add_RegistrationServicer_to_server(
                RegistrationServicer(
                    self.driver_name, self.endpoint, self.supported_versions, self.registration
                ),
                reg_server,
            )
            reg_socket = _Socket(self._reg_path, reg_server)
            try:
                if self._rolling_update:
                    # Before the socket exists: a kill right after it leaves a record.
                    write_record(self._dra_path, self._reg_path)
                reg_socket.start()
            except Exception:
                dra_socket.stop(0)
                self._sockets.clear()
                record_path(self._dra_path).unlink(missing_ok=True)
                raise
            self._sockets.append(reg_socket)
            log.info(
                "plugin serving driver=%s endpoint=%s registration=%s versions=%s",
                self.driver_name,
                self.endpoint,
                self.registration_socket,
                ",".join(self.supported_versions),
            )

    def stop(self, grace: float = 5.0, drain: float = 0.0) -> None:
        """Finish the calls in progress within ``grace`` seconds; deregister; serve on while
        the kubelet keeps its connection, at most ``drain`` seconds; finish the calls that
        came meanwhile within ``grace`` seconds; remove the sockets."""
        with self._lock:
            registered = [s for s in self._sockets if s.path == self._reg_path]
            if registered and not self._in_flight.wait_idle(grace):
                log.warning(
                    "deregistering with calls in progress driver=%s calls=%d grace_s=%s",
                    self.driver_name,
                    self._in_flight.count,
                    grace,
                )
            for sock in registered:
                sock.stop(0)
            if registered and drain > 0:
                self._wait_for_the_kubelet_to_let_go(drain)
            self._stopping.set()
            for sock in reversed(self._sockets):
                if sock not in registered:
                    sock.stop(grace)
            if self._sockets:
                record_path(self._dra_path).unlink(missing_ok=True)
                log.info("plugin stopped driver=%s endpoint=%s", self.driver_name, self.endpoint)
            self._sockets.clear()

    def _wait_for_the_kubelet_to_let_go(self, limit: float) -> None:
        started = time.monotonic()
        peers = connected_peers(str(self._dra_path))
        # Without /proc/self/fd nothing shows when the kubelet let go: serve the whole time.
        while (peers is None or peers > 0) and time.monotonic() - started < limit:
            time.sleep(DRAIN_POLL_S)
            peers = connected_peers(str(self._dra_path))
        log.info(
            "deregistered, draining done driver=%s endpoint=%s waited_s=%.2f open_connections=%s",
            self.driver_name,
            self.endpoint,
            time.monotonic() - started,
            "unknown" if peers is None else peers,
        )
