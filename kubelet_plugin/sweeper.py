"""The handlers' sweep after start-up: :class:`Sweeper`.

An unprepare on a GPU that NVML reports lost succeeds and leaves what it could not undo there
(a MIG instance, a time-slice interval, an MPS daemon's compute mode) recorded for a later
sweep (``docs/checkpoint.md``). The plugin's sweeper looks for such leftovers every
``--sweep-interval`` seconds, and at once when one of a GPU's health taints heals; it asks
:meth:`driver.prepare.recovery.Recovery.left_over`, which reads the handlers' journals and
the checkpoint alone (no NVML call, no node lock), and runs the sweep
(:meth:`driver.prepare.recovery.Recovery.sweep`, under the node lock) only when something is
left. So a GPU whose loss no taint marks (a lost effect of ``Ignore``) is swept too, and a
sweep that failed (the node lock busy) or could not undo everything (the GPU still lost) is
tried again at the next look, without a heal or a restart. While sweeps clean nothing (the
GPU still lost) the looks back off, doubling the wait up to ``BACKOFF_MAX`` intervals, so a
GPU lost for days costs a log line every 16 minutes, not every minute; a heal, a failed
sweep or a change in what is left brings the wait back to one interval.

It runs in a thread of its own: health listeners are called under the monitor's lock, and the
sweep waits for the node lock. Heals that come while a look runs make one more look after it,
not one each.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence

from driver.health.monitor import HealthChange

log = logging.getLogger(__name__)

BACKOFF_MAX = 16  # the longest wait between looks, in intervals, while sweeps clean nothing


class Sweeper:
    """Sweeps while ``left_over`` names something: every ``interval_s`` seconds, and at once
    on a heal (it is a health listener) or a :meth:`request`."""

    def __init__(
        self,
        sweep: Callable[[], object],
        left_over: Callable[[], Sequence[str]],
        interval_s: float,
    ) -> None:
        self._sweep = sweep
        self._left_over = left_over
        self._interval_s = interval_s
        self._wait_s = interval_s  # doubles while sweeps clean nothing, up to BACKOFF_MAX
        self._cond = threading.Condition()
        self._due = False  # a look was asked for
        self._busy = False  # a look runs
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._last: tuple[str, ...] = ()

    def __call__(self, change: HealthChange) -> None:
        if change.kind == "healed":
            self.request()

    def start(self) -> None:
        """Look every ``interval_s`` seconds from now on (a no-op once started or stopped)."""
        with self._cond:
            if self._thread is not None or self._stopping:
                return
            self._thread = threading.Thread(target=self._run, name="sweeper", daemon=True)
        self._thread.start()

    def request(self) -> None:
        """Look soon: now, or once more after the look that runs."""
        with self._cond:
            self._due = True
            self._wait_s = self._interval_s  # a heal: the GPU may answer again
            self._cond.notify_all()
        self.start()

    def stop(self, timeout: float) -> None:
        """No look starts from now on; waits up to ``timeout`` seconds for the one that runs
        (it may be waiting for the node lock)."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
            thread = self._thread
        if thread is not None:
            thread.join(timeout)

    def wait_idle(self, timeout: float) -> bool:
        """Whether no look runs or is due (within ``timeout`` seconds)."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._due and not self._busy, timeout)

    def _run(self) -> None:
        while True:
            with self._cond:
                if not self._due and not self._stopping:
                    self._cond.wait(self._wait_s)
                if self._stopping:
                    return
                self._due = False
                self._busy = True
            try:
                self._look()
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()

    def _look(self) -> None:
        try:
            left = tuple(self._left_over())
        except Exception:  # a journal that cannot be read, say: the next look tries again
            log.exception("looking for what unprepares left failed")
            return
        if left != self._last:  # once per change, not every look while a GPU stays lost
            if left:
                log.info("left for the sweep left=%s", "; ".join(left))
            else:
                log.info("nothing left for the sweep")
            self._last = left
        if not left:
            self._back_off(False)
            return
        try:
            self._sweep()
        except Exception:  # the node lock timed out, say: the next look sweeps again
            self._back_off(False)
            log.exception("sweep failed; tried again in %.0fs", self._interval_s)
            return
        try:
            cleaned_nothing = tuple(self._left_over()) == left
        except Exception:
            cleaned_nothing = False
        self._back_off(cleaned_nothing)

    def _back_off(self, cleaned_nothing: bool) -> None:
        """The wait before the next look: doubled after a sweep that cleaned nothing (up to
        ``BACKOFF_MAX`` intervals), else one interval."""
        with self._cond:
            if cleaned_nothing:
                self._wait_s = min(self._wait_s * 2, self._interval_s * BACKOFF_MAX)
            else:
                self._wait_s = self._interval_s
