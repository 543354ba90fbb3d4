"""The thread that feeds a :class:`driver.health.monitor.HealthMonitor` from NVML.

It waits for NVML events (XID, ECC, GPU lost) and, every probe interval,
probes each GPU. A probe runs on a helper thread so that a GPU that hangs the
call is seen as not answering after the probe timeout; while that call is
still stuck, the GPU keeps failing its probes. The NVML calls are passed in as
plain callables (the facade's event wait and probe), so this module needs no
NVML import and tests can drive it with anything.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from driver.errors import NvmlError
from driver.health.monitor import HealthMonitor
from driver.nvml.types import DeviceProbe, XidEvent

if TYPE_CHECKING:
    from driver.nvml.facade import Nvml

log = logging.getLogger(__name__)

NVML_ERROR_GPU_IS_LOST = 15

WaitEvent = Callable[[float], XidEvent | None]
Probe = Callable[[str], DeviceProbe]
RecoveryAction = Callable[[str], str | None]


class HealthWatcher:
    """Runs the event loop and the periodic probes on a daemon thread."""

    def __init__(
        self,
        monitor: HealthMonitor,
        wait_event: WaitEvent,
        probe: Probe,
        *,
        recovery_action: RecoveryAction | None = None,
        register_events: Callable[[], list[str]] | None = None,
    ) -> None:
        self._register_events = register_events
        self._monitor = monitor
        self._wait_event = wait_event
        self._probe = probe
        self._recovery_action = recovery_action
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._hung: dict[str, threading.Thread] = {}
        self._watch_failing = False
        self._register_failed = False  # no event set: register() again at each probe round
        self._unregistered: set[str] = set()

    @classmethod
    def from_facade(cls, monitor: HealthMonitor, nvml: Nvml) -> HealthWatcher:
        """A watcher over the NVML facade: its event wait, probe and recovery action."""
        return cls(
            monitor,
            nvml.wait_event,
            nvml.probe,
            recovery_action=nvml.recovery_action,
            register_events=lambda: nvml.register_events(monitor.gpus()),
        )

    def register(self) -> None:
        """Register for NVML events; GPUs that cannot be registered are marked unmonitored."""
        if self._register_events is None:
            return
        try:
            failed = self._register_events()
        except NvmlError as e:
            if not self._register_failed:
                log.error("NVML event registration failed code=%d error=%s", e.code, e)
            self._register_failed = True
            self._watch_failing = True
            self._monitor.observe_watch_error(str(e))
            return
        if self._register_failed:
            log.info("NVML event registration works again")
            self._register_failed = False
        self._unregistered = set(failed)
        # A restarted plugin restores an earlier process's `unmonitored`; registering is when
        # this process learns it can watch (the wait's own failures taint again).
        self._monitor.observe_watch_ok(still_unmonitored=self._unregistered)
        if failed:
            self._monitor.observe_watch_error("event registration failed", gpus=failed)

    def start(self) -> None:
        """Register for events, probe every GPU once, then watch on a daemon thread."""
        if self._thread is not None:
            return
        self.register()
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="gpu-health", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def probe_all(self) -> None:
        """Probe every GPU once, then let faults heal that now may."""
        for uuid in self._monitor.gpus():
            self._probe_one(uuid)
        self._monitor.tick()

    def poll_event(self) -> None:
        """Wait for one NVML event (up to the policy's event wait) and record it."""
        wait = self._monitor.policy.event_wait_seconds
        try:
            event = self._wait_event(wait)
        except NvmlError as e:
            if e.code == NVML_ERROR_GPU_IS_LOST:
                self._monitor.observe_event(XidEvent("", "gpu-lost", 0, time.time()))
            else:
                if not self._watch_failing:
                    log.error("NVML event wait failed code=%d error=%s", e.code, e)
                self._watch_failing = True
                self._monitor.observe_watch_error(str(e))
            self._stop.wait(wait)
            return
        if self._watch_failing:
            log.info("NVML event wait works again")
            self._watch_failing = False
            self._monitor.observe_watch_ok(still_unmonitored=self._unregistered)
        if event is not None:
            self._monitor.observe_event(event)

    def _run(self) -> None:
        interval = self._monitor.policy.probe_interval_seconds
        next_probe = 0.0
        while not self._stop.is_set():
            try:
                if time.monotonic() >= next_probe:
                    if self._register_failed:
                        self.register()
                    self.probe_all()
                    next_probe = time.monotonic() + interval
                self.poll_event()
                self._monitor.tick()
            except Exception:
                log.exception("GPU health loop failed; continuing")
                self._stop.wait(1.0)

    def _probe_one(self, uuid: str) -> None:
        timeout = self._monitor.policy.probe_timeout_seconds
        stuck = self._hung.get(uuid)
        if stuck is not None and stuck.is_alive():
            detail = f"an earlier probe has been stuck for more than {timeout:g}s"
            self._monitor.observe_probe(DeviceProbe(uuid, healthy=False, lost=False, detail=detail))
            return
        self._hung.pop(uuid, None)
        box: list[tuple[DeviceProbe, str | None]] = []
        worker = threading.Thread(
            target=self._call_probe, args=(uuid, box), name=f"gpu-probe-{uuid}", daemon=True
        )
        worker.start()
        worker.join(timeout)
        if worker.is_alive():
            self._hung[uuid] = worker
            log.warning("GPU probe timed out gpu=%s timeout_s=%g", uuid, timeout)
            detail = f"probe timed out after {timeout:g}s"
            self._monitor.observe_probe(DeviceProbe(uuid, healthy=False, lost=False, detail=detail))
            return
        if box:
            probe, action = box[0]
            self._monitor.observe_probe(probe, action)

    def _call_probe(self, uuid: str, box: list[tuple[DeviceProbe, str | None]]) -> None:
        try:
            probe = self._probe(uuid)
        except NvmlError as e:
            lost = e.code == NVML_ERROR_GPU_IS_LOST
            probe = DeviceProbe(uuid, healthy=False, lost=lost, code=e.code, detail=str(e))
        except Exception as e:
            probe = DeviceProbe(uuid, healthy=False, lost=False, detail=f"probe raised {e!r}")
        box.append((probe, self._read_action(uuid) if probe.healthy else None))

    def _read_action(self, uuid: str) -> str | None:
        if self._recovery_action is None:
            return None
        try:
            return self._recovery_action(uuid)
        except NvmlError as e:
            log.debug("recovery action not readable gpu=%s code=%d", uuid, e.code)
            return None
