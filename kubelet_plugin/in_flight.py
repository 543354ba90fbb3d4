"""The kubelet's DRA calls in progress, so that a stopping plugin can let them finish.

The kubelet closes its connection to a plugin instance the moment it deregisters it, and a
call still in progress on that connection fails (kubelet v1.37.2,
``pkg/kubelet/cm/dra/plugin``, ``remove``). So a stopping plugin waits for its calls to
finish while it is still registered, and only then removes its registration socket.

The liveness probe asks how long the oldest call has run: a probe whose own call waits for
a thread behind the kubelet's calls is answered by a busy server, not a stuck one, while
none of those calls has outlived the kubelet's deadline.
"""

from __future__ import annotations

import threading
import time
from types import TracebackType


class InFlight:
    """A count of calls in progress; ``with in_flight:`` around each call."""

    def __init__(self) -> None:
        self._done = threading.Condition()
        self._count = 0
        self._started: dict[int, float] = {}  # thread → when its call began (monotonic)

    def __enter__(self) -> None:
        with self._done:
            self._count += 1
            self._started[threading.get_ident()] = time.monotonic()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        with self._done:
            self._count -= 1
            self._started.pop(threading.get_ident(), None)
            if self._count == 0:
                self._done.notify_all()

    @property
    def count(self) -> int:
        return self._count

    def oldest_s(self) -> float | None:
        """Seconds the longest-running call in progress has run; None when none is."""
        with self._done:
            if not self._started:
                return None
            return time.monotonic() - min(self._started.values())

    def wait_idle(self, timeout: float) -> bool:
        """True once no call is in progress; False if one still is after ``timeout`` s."""
        with self._done:
            return self._done.wait_for(lambda: self._count == 0, timeout)
