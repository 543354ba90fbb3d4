"""The values and errors of the CEL evaluator: quantities and semantic versions as the
Kubernetes libraries define them, and the two errors a selector raises."""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Mapping
from decimal import Decimal
from typing import Any

from celpy.evaluation import CELEvalError as CelpyEvalError


class CelSyntaxError(ValueError):
    """An expression that does not parse or uses an unknown function."""


class CelEvalError(Exception):
    """An expression that fails on one device (a missing attribute, a type mismatch)."""


def returning_errors(functions: Mapping[str, Callable[..., Any]]) -> dict[str, Callable[..., Any]]:
    """``functions`` returning a :class:`CelEvalError` they raise as a CEL error value, as
    cel-go's functions do, so that ``||``, ``&&`` and ``?:`` can absorb it; an exception
    would end the whole evaluation."""

    def wrapped(function: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(function)
        def call(*args: Any) -> Any:
            try:
                return function(*args)
            except CelEvalError as e:
                return CelpyEvalError(str(e))

        return call

    return {name: wrapped(f) for name, f in functions.items()}


@functools.total_ordering
class Quantity:
    """A Kubernetes quantity in CEL (``quantity("40Gi")``, ``device.capacity[...]``)."""

    def __init__(self, value: Decimal, text: str) -> None:
        self.value = value
        self.text = text

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Quantity) and self.value == other.value

    def __lt__(self, other: object) -> bool:
        if not isinstance(other, Quantity):
            return NotImplemented
        return self.value < other.value

    def __hash__(self) -> int:
        return hash(self.value)

    def __repr__(self) -> str:
        return f"quantity({self.text!r})"


_SEMVER = re.compile(
    r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
    r"(?:-([0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*))?(?:\+[0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*)?$"
)


@functools.total_ordering
class Semver:
    """A semantic version in CEL (``semver("1.2.3")``, version attributes)."""

    def __init__(self, text: str) -> None:
        m = _SEMVER.match(text)
        if m is None:
            raise CelEvalError(f"{text!r} is not a semantic version")
        self.text = text
        self.core = (int(m[1]), int(m[2]), int(m[3]))
        self.pre: tuple[tuple[int, int | str], ...] = tuple(
            (0, int(p)) if p.isdigit() else (1, p) for p in (m[4].split(".") if m[4] else [])
        )

    def _key(self) -> tuple[Any, ...]:
        # a release sorts after its pre-releases
        return (self.core, not self.pre, self.pre)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Semver) and self._key() == other._key()

    def __lt__(self, other: object) -> bool:
        if not isinstance(other, Semver):
            return NotImplemented
        return self._key() < other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        return f"semver({self.text!r})"
