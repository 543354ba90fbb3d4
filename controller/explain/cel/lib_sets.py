"""cel-go's sets library (``ext.Sets``, in Kubernetes' base CEL environment since 1.29), as
:data:`FUNCTIONS`: ``sets.contains(a, b)`` (every element of ``b`` is in ``a``),
``sets.equivalent(a, b)`` (each contains the other) and ``sets.intersects(a, b)`` (one element
in common). Elements match with cel-go's ``==`` (``1 == 1.0``; an error is no match)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import celpy.celtypes as ct

from controller.explain.cel.compare import contained
from controller.explain.cel.values import returning_errors


def _list(value: Any, name: str) -> list[Any]:
    if not isinstance(value, list):
        raise TypeError(f"no such overload: sets.{name} needs lists, not {type(value).__name__}")
    return value


def _has_all(items: list[Any], wanted: list[Any]) -> bool:
    return all(any(contained(w, x) for x in items) for w in wanted)


def _contains(a: Any, b: Any) -> ct.BoolType:
    return ct.BoolType(_has_all(_list(a, "contains"), _list(b, "contains")))


def _equivalent(a: Any, b: Any) -> ct.BoolType:
    x, y = _list(a, "equivalent"), _list(b, "equivalent")
    return ct.BoolType(_has_all(x, y) and _has_all(y, x))


def _intersects(a: Any, b: Any) -> ct.BoolType:
    x, y = _list(a, "intersects"), _list(b, "intersects")
    return ct.BoolType(any(contained(v, w) for v in x for w in y))


FUNCTIONS: Mapping[str, Callable[..., Any]] = returning_errors(
    {
        "sets.contains": _contains,
        "sets.equivalent": _equivalent,
        "sets.intersects": _intersects,
    }
)
