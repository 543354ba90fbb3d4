"""Fault points: named places where a test makes the process die as if SIGKILLed.

Crash-safety tests set ``TRANCHE_FAULT_POINT`` (read once, at start-up, by the
entry point through :meth:`FaultPoints.from_env`) or pass a hook. At the named
point the process calls ``os._exit(137)``: no ``finally`` blocks, no flushing,
the same as a ``kill -9``. With ``TRANCHE_FAULT_ACTION=hang`` the thread that
reaches the point logs ``fault point reached point=<name>`` and blocks there for
good instead (the other threads run on), so that a test can send the process a
real ``SIGKILL`` from outside, as the kubelet or the OOM killer would. Every point
is listed in :data:`POINTS` and in ``docs/checkpoint.md``.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass

ENV_VAR = "TRANCHE_FAULT_POINT"
ACTION_ENV_VAR = "TRANCHE_FAULT_ACTION"  # "exit" (default) or "hang"
REACHED = "fault point reached"

log = logging.getLogger(__name__)
EXIT_CODE = 137

POINTS = (
    "prepare:after-lock",
    "prepare:after-rollback",
    "prepare:after-started",
    "prepare:after-step",
    "prepare:after-cdi",
    "prepare:after-completed",
    "unprepare:after-lock",
    "unprepare:after-undo-step",
    "unprepare:after-cdi-removed",
    "unprepare:after-removed",
    "unprepare:after-hold-released",
    "checkpoint:before-replace",
    "checkpoint:before-remove",
    "checkpoint:before-started-cleared",
    "checkpoint:after-convert",
    "cdi:before-replace",
    "mig:after-enable",
    "mig:after-intent",
    "mig:after-create",
    "mps:after-spawn",
)


def _die(point: str) -> None:
    os._exit(EXIT_CODE)


def _hang(point: str) -> None:
    """Block the calling thread at ``point`` until the process is killed."""
    log.warning("%s point=%s", REACHED, point)
    for handler in logging.getLogger().handlers:
        handler.flush()
    threading.Event().wait()


@dataclass(frozen=True)
class FaultPoints:
    """Which point (if any) kills the process, and how."""

    point: str = ""
    action: Callable[[str], None] = _die

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> FaultPoints:
        point = environ.get(ENV_VAR, "")
        if point and point not in POINTS:
            raise ValueError(
                f"{ENV_VAR}: unknown fault point {point!r}; known: {', '.join(POINTS)}"
            )
        actions = {"": _die, "exit": _die, "hang": _hang}
        how = environ.get(ACTION_ENV_VAR, "")
        if how not in actions:
            raise ValueError(f"{ACTION_ENV_VAR}: {how!r} is not exit or hang")
        return cls(point=point, action=actions[how])

    def reached(self, point: str) -> None:
        if self.point == point:
            self.action(point)


NO_FAULTS = FaultPoints()
