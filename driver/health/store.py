"""The small state file that lets health taints outlive a plugin restart.

The file holds the active faults per GPU, the boot id of the node and a
checksum. It is written atomically (temporary file, ``fsync``, ``os.replace``).
Faults are restored only from the same boot: a reboot resets every GPU, so a
file from an earlier boot is ignored. A corrupt or unknown file is reported
and ignored; the monitor then rebuilds its state from probes and new events.
After a restore the watcher probes every GPU at once, so a lost GPU that
answers again heals by the usual rules.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from driver.health.monitor import Fault
from driver.health.policy import FaultClass

log = logging.getLogger(__name__)

VERSION = 1
BOOT_ID_PATH = Path("/proc/sys/kernel/random/boot_id")


def read_boot_id(path: Path = BOOT_ID_PATH) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def _checksum(body: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def _fault_to_json(f: Fault) -> dict[str, Any]:
    return {
        "key": f.key,
        "value": f.value,
        "class": f.fault_class.value,
        "effect": f.effect,
        "message": f.message,
        "timeAdded": f.time_added,
        "lastSeen": f.last_seen,
        "recoveryAction": f.recovery_action,
        "count": f.count,
        "device": f.device,
    }


def _fault_from_json(d: Mapping[str, Any]) -> Fault:
    return Fault(
        key=str(d["key"]),
        value=str(d["value"]),
        fault_class=FaultClass(d["class"]),
        effect=str(d["effect"]),
        message=str(d["message"]),
        time_added=float(d["timeAdded"]),
        last_seen=float(d["lastSeen"]),
        recovery_action=None if d["recoveryAction"] is None else str(d["recoveryAction"]),
        count=int(d["count"]),
        device=None if d.get("device") is None else str(d["device"]),
    )


class HealthStateFile:
    """A :class:`driver.health.monitor.FaultStore` backed by one JSON file."""

    def __init__(self, path: Path, boot_id: str | None = None) -> None:
        self.path = path
        self.boot_id = read_boot_id() if boot_id is None else boot_id

    def save(self, faults: Mapping[str, Iterable[Fault]]) -> None:
        body = {
            "version": VERSION,
            "bootId": self.boot_id,
            "gpus": {
                uuid: [_fault_to_json(f) for f in fs] for uuid, fs in sorted(faults.items()) if fs
            },
        }
        data = json.dumps({**body, "checksum": _checksum(body)}, indent=1, sort_keys=True)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=f".{self.path.name}.")
        try:
            with os.fdopen(fd, "w") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            Path(tmp).replace(self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def load(self) -> dict[str, list[Fault]]:
        try:
            raw_bytes = self.path.read_bytes()
        except FileNotFoundError:
            return {}
        except OSError as e:
            log.error("health state file unreadable, starting clean path=%s error=%s", self.path, e)
            return {}
        try:
            doc = json.loads(raw_bytes.decode("utf-8"))  # UnicodeDecodeError is a ValueError
            body = {k: doc[k] for k in ("version", "bootId", "gpus")}
            if doc.get("checksum") != _checksum(body):
                raise ValueError("checksum mismatch")
            if body["version"] != VERSION:
                raise ValueError(f"unknown version {body['version']!r}")
            faults = {
                str(uuid): [_fault_from_json(f) for f in fs] for uuid, fs in body["gpus"].items()
            }
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            log.error("health state file is corrupt, ignoring it path=%s error=%s", self.path, e)
            return {}
        if body["bootId"] != self.boot_id:
            log.info("health state file is from another boot, GPUs were reset path=%s", self.path)
            return {}
        return faults
