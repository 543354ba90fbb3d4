"""Sockets of earlier plugin instances of this driver that nobody serves, removed at start.

A plugin pod that ends with SIGKILL (its grace period run out, the OOM killer, a node-level
kill) leaves its sockets behind. With per-pod sockets (``--rolling-update-uid``) the next pod
has names of its own, so nothing replaced them: every killed pod added two files, and the
kubelet kept the dead instance registered (its plugin watcher deregisters an instance only
when the registration socket goes) or, starting later, dialled it again and again
(docs/kubelet-grpc.md, "Sockets a killed pod left").

At start, before it registers, the plugin removes the sockets of this driver that refuse a
connection (ECONNREFUSED). A socket that accepts one, or whose accept queue is full, is the
other pod of a rolling update and stays; another driver's socket is never touched. Which
sockets are this driver's:

* In ``plugins/<driver>/``, this driver's own directory: ``dra.sock``, ``dra-<pod UID>.sock``
  and ``dra-<hash of the UID>.sock``.
* In ``plugins_registry/``, where every driver's registration sockets lie: the ones an
  instance recorded in ``plugins/<driver>/<its DRA socket's stem>.registration`` before it
  created them (any of the three forms of :func:`~kubelet_plugin.grpc_server.
  registration_socket_name`, ``dra-<hash of driver and UID>-reg.sock`` included, which
  names no driver); and, for instances that kept no record (earlier versions),
  ``<driver>-reg.sock``, ``<driver>-<pod UID>-reg.sock`` and ``<driver>-<hash of the
  UID>-reg.sock`` where the hash holds an upper-case letter or ``_``, which no driver name
  does, so another driver called ``<driver>-<word>`` never matches.
"""

from __future__ import annotations

import logging
import re
import socket
import stat
from pathlib import Path

from driver.files import write_atomic

log = logging.getLogger(__name__)

_UUID = r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
_B64 = r"[A-Za-z0-9_-]"
RECORD_SUFFIX = ".registration"
DRA_PATTERN = re.compile(rf"dra(-(?:{_UUID}|{_B64}{{16}}))?\.sock")
_RECORDED_NAME = re.compile(rf"{_B64}[A-Za-z0-9._-]*-reg\.sock")


def registration_pattern(driver_name: str) -> re.Pattern[str]:
    """Registration socket names that are this driver's by their name alone (``grpc_server``),
    and no other driver's: a UID hash must hold a character no DNS subdomain has."""
    d = re.escape(driver_name)
    hashed = rf"(?={_B64}*[A-Z_]){_B64}{{11}}"
    return re.compile(rf"{d}(-(?:{_UUID}|{hashed}))?-reg\.sock")


def record_path(dra_path: Path) -> Path:
    """Where the instance serving ``dra_path`` records its registration socket's name."""
    return dra_path.with_name(dra_path.stem + RECORD_SUFFIX)


def write_record(dra_path: Path, registration: Path) -> None:
    write_atomic(record_path(dra_path), f"{registration.name}\n".encode())


def refuses_connections(path: Path) -> bool:
    """True only where the socket is there and nobody listens (ECONNREFUSED). A socket that
    accepts, or whose backlog is full (EAGAIN), is served; any other answer is no proof."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.setblocking(False)
        try:
            sock.connect(str(path))
        except ConnectionRefusedError:
            return True
        except OSError:
            return False
    return False


def _identity(path: Path) -> tuple[int, int] | None:
    """The socket's (device, inode); None where ``path`` is gone or not a socket."""
    try:
        st = path.lstat()
    except OSError:
        return None
    return (st.st_dev, st.st_ino) if stat.S_ISSOCK(st.st_mode) else None


class _Sweep:
    def __init__(self, driver_name: str, keep: set[Path]) -> None:
        self.driver_name = driver_name
        self.keep = keep
        self.removed: list[Path] = []

    def remove_if_dead(self, path: Path) -> bool:
        """Remove the socket ``path`` if nobody serves it; True where no socket is left."""
        before = _identity(path)
        if before is None:  # gone, or something else than a socket took the name
            return True
        if path in self.keep or not refuses_connections(path):
            return False
        if _identity(path) != before:  # replaced meanwhile: a new instance's socket
            return False
        try:
            path.unlink(missing_ok=True)
        except OSError as e:
            log.warning(
                "cannot remove stale socket",
                extra={"driver": self.driver_name, "path": str(path), "error": e.strerror},
            )
            return False
        log.info(
            "removed stale socket of an earlier plugin instance",
            extra={"driver": self.driver_name, "path": str(path), "reason": "connection refused"},
        )
        self.removed.append(path)
        return True

    def recorded(self, plugin_dir: Path, registry_dir: Path, own: set[Path]) -> None:
        for record in sorted(plugin_dir.glob(f"*{RECORD_SUFFIX}")):
            if record in own:
                continue
            try:
                name = record.read_text().strip()
            except OSError:
                continue
            if not _RECORDED_NAME.fullmatch(name):
                log.warning(
                    "removed a registration record that names no socket",
                    extra={"driver": self.driver_name, "record": str(record), "socket": name},
                )
                record.unlink(missing_ok=True)
                continue
            if self.remove_if_dead(registry_dir / name):
                record.unlink(missing_ok=True)

    def by_name(self, directory: Path, pattern: re.Pattern[str]) -> None:
        try:
            names = sorted(p.name for p in directory.iterdir())
        except OSError:
            return
        for name in names:
            if pattern.fullmatch(name):
                self.remove_if_dead(directory / name)


def remove_stale_sockets(
    driver_name: str, registry_dir: Path, plugin_dir: Path, keep: set[Path]
) -> list[Path]:
    """Remove this driver's sockets in ``registry_dir`` and ``plugin_dir`` that nobody
    serves, except those in ``keep`` (the starting instance's own); return them."""
    sweep = _Sweep(driver_name, keep)
    sweep.recorded(plugin_dir, registry_dir, {record_path(p) for p in keep})
    sweep.by_name(registry_dir, registration_pattern(driver_name))
    sweep.by_name(plugin_dir, DRA_PATTERN)
    return sweep.removed
