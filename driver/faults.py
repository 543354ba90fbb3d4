"""Fault points: named places where a test makes the process die as if SIGKILLed.

Crash-safety tests set ``TRANCHE_FAULT_POINT`` (read once, at start-up, by the
entry point through :meth:`FaultPoints.from_env`) or pass a hook. At the named
point the process calls ``os._exit(137)``: no ``finally`` blocks, no flushing,
the same as a ``kill -9``. Every point is listed in :data:`POINTS` and in
``docs/checkpoint.md``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass

ENV_VAR = "TRANCHE_FAULT_POINT"
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
    "checkpoint:before-replace",
    "checkpoint:before-remove",
    "checkpoint:before-started-cleared",
    "checkpoint:after-convert",
    "cdi:before-replace",
    "mig:after-intent",
    "mig:after-create",
    "mps:after-spawn",
)


def _die(point: str) -> None:
    os._exit(EXIT_CODE)


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
        return cls(point=point)

    def reached(self, point: str) -> None:
        if self.point == point:
            self.action(point)


NO_FAULTS = FaultPoints()
