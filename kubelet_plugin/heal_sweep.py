"""The handlers' sweep when a GPU heals: :class:`SweepOnHeal`.

An unprepare on a GPU that NVML reports lost succeeds and leaves what it could not undo there
(a MIG instance, a time-slice interval, an MPS daemon's compute mode) recorded for a later
sweep (``docs/checkpoint.md``). When one of a GPU's health taints heals, the GPU answers
again, so the plugin runs that sweep (:meth:`driver.prepare.recovery.Recovery.sweep`) then.
It runs in a thread of its own: health listeners are called under the monitor's lock, and the
sweep waits for the node lock. Heals that come while a sweep runs make one more sweep after
it, not one each.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from driver.health.monitor import HealthChange

log = logging.getLogger(__name__)


class SweepOnHeal:
    """A health listener that runs ``sweep`` in the background after every heal."""

    def __init__(self, sweep: Callable[[], object]) -> None:
        self._sweep = sweep
        self._lock = threading.Lock()
        self._running = False
        self._again = False
        self._idle = threading.Event()
        self._idle.set()

    def __call__(self, change: HealthChange) -> None:
        if change.kind == "healed":
            self.request()

    def request(self) -> None:
        """Sweep soon: now in a new thread, or once more after the sweep that runs."""
        with self._lock:
            if self._running:
                self._again = True
                return
            self._running = True
            self._idle.clear()
        threading.Thread(target=self._run, name="sweep-after-heal", daemon=True).start()

    def wait_idle(self, timeout: float) -> bool:
        """Whether no sweep runs or is due (within ``timeout`` seconds)."""
        return self._idle.wait(timeout)

    def _run(self) -> None:
        while True:
            try:
                self._sweep()
            except Exception:  # the node lock timed out, say: the next heal or start-up sweeps
                log.exception("sweep after a GPU healed failed")
            with self._lock:
                if not self._again:
                    self._running = False
                    self._idle.set()
                    return
                self._again = False
