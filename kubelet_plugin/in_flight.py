"""The kubelet's DRA calls in progress, so that a stopping plugin can let them finish.

The kubelet closes its connection to a plugin instance the moment it deregisters it, and a
call still in progress on that connection fails (kubelet v1.37.2,
``pkg/kubelet/cm/dra/plugin``, ``remove``). So a stopping plugin waits for its calls to
finish while it is still registered, and only then removes its registration socket.
"""

from __future__ import annotations

import threading
from types import TracebackType


class InFlight:
    """A count of calls in progress; ``with in_flight:`` around each call."""

    def __init__(self) -> None:
        self._done = threading.Condition()
        self._count = 0

    def __enter__(self) -> None:
        with self._done:
            self._count += 1

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        with self._done:
            self._count -= 1
            if self._count == 0:
                self._done.notify_all()

    @property
    def count(self) -> int:
        return self._count

    def wait_idle(self, timeout: float) -> bool:
        """True once no call is in progress; False if one still is after ``timeout`` s."""
        with self._done:
            return self._done.wait_for(lambda: self._count == 0, timeout)
