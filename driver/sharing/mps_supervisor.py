"""MPS: the supervisor thread, which restarts the daemons that died while claims use them
(:meth:`~driver.sharing.mps_daemons.MpsDaemons.restart_dead`)."""

from __future__ import annotations

import logging
import threading

from driver.errors import TrancheError
from driver.sharing.mps_daemons import MpsDaemons
from driver.sharing.mps_pipe import CONTROL_TIMEOUT_S

log = logging.getLogger(__name__)


class MpsSupervisor:
    """A thread that restarts dead daemons every ``interval_s``."""

    def __init__(self, daemons: MpsDaemons, interval_s: float) -> None:
        self._daemons = daemons
        self._interval_s = interval_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="mps-supervisor", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self._interval_s + CONTROL_TIMEOUT_S)
            self._thread = None

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            try:
                self._daemons.restart_dead()
            except (OSError, TrancheError):
                log.exception("mps supervision failed")
