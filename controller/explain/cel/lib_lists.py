"""The list functions of the DRA selector environment, as :data:`FUNCTIONS`: Kubernetes' lists
library (``sum``, ``min``, ``max``, ``isSorted``, ``indexOf``, ``lastIndexOf``, ``includes``)
and cel-go's ``ext.Lists`` version 3 (``slice``, ``flatten``, ``sort``, ``distinct``,
``reverse``, ``lists.range``; ``sortBy`` is a macro, in ``comprehensions.py``, over
:func:`sort_by_keys`). Results and errors follow cel-go's: ``[].max()`` is an error,
``sort()`` wants elements of one comparable type, numbers compare across int and double."""

from __future__ import annotations

import datetime
import functools
import itertools
import math
from collections.abc import Callable, Mapping
from typing import Any

import celpy.celtypes as ct

from controller.explain.cel.compare import contained
from controller.explain.cel.values import CelEvalError, returning_errors

_MAX_RANGE = 1_000_000  # cel-go's default for lists.range


def _kind(value: Any) -> str | None:
    """The comparable CEL type of ``value`` (cel-go's ``traits.Comparer``), or None."""
    for kind, types in (
        ("bool", ct.BoolType),
        ("int", ct.IntType),
        ("uint", ct.UintType),
        ("double", ct.DoubleType),
        ("string", ct.StringType | str),
        ("bytes", ct.BytesType | bytes),
        ("duration", ct.DurationType | datetime.timedelta),
        ("timestamp", ct.TimestampType | datetime.datetime),
    ):
        if isinstance(value, types):
            return kind
    return None


_NUMBERS = frozenset({"int", "uint", "double"})


def _compare(a: Any, b: Any) -> int | None:
    """cel-go's ``a.Compare(b)``: -1, 0 or 1, or None where it is an error (other types,
    NaN)."""
    ka, kb = _kind(a), _kind(b)
    if ka is None or kb is None:
        return None
    if ka != kb and not (ka in _NUMBERS and kb in _NUMBERS):
        return None
    if ka in _NUMBERS:
        x = float(a) if ka == "double" else int(a)
        y = float(b) if kb == "double" else int(b)
        if math.isnan(x) or math.isnan(y):
            return None
        return int(x > y) - int(x < y)
    return int(a > b) - int(a < b)


def _list(value: Any, name: str) -> list[Any]:
    if not isinstance(value, list):
        raise TypeError(f"no such overload: {name} needs a list, not {type(value).__name__}")
    return value


def _comparable(value: Any, name: str) -> Any:
    if _kind(value) is None:
        raise TypeError(f"no such overload: {name} of a list of {type(value).__name__}")
    return value


_ZEROS: Mapping[str, Callable[[], Any]] = {
    "int": lambda: ct.IntType(0),
    "uint": lambda: ct.UintType(0),
    "double": lambda: ct.DoubleType(0.0),
    "duration": lambda: ct.DurationType(0),
}


def _sum(items: Any) -> Any:
    values = _list(items, "sum")
    if not values:
        return ct.IntType(0)
    kind = _kind(values[0]) or ""
    if kind not in _ZEROS:
        raise TypeError(f"no such overload: sum of a list of {type(values[0]).__name__}")
    total = _ZEROS[kind]()
    for value in values:
        if _kind(value) != kind:
            raise TypeError(f"no such overload: {kind} + {type(value).__name__}")
        try:
            total = total + value
        except (ValueError, OverflowError) as e:
            raise CelEvalError(f"{kind} overflow") from e
    return ct.DoubleType(total) if kind == "double" else total  # float + float is a float


def _extreme(name: str, prefer: int) -> Callable[[Any], Any]:
    def call(items: Any) -> Any:
        result = None
        for value in _list(items, name):
            _comparable(value, name)
            if result is None or _compare(result, value) == prefer:
                result = value
        if result is None:
            raise CelEvalError(f"{name} called on empty list")
        return result

    return call


def _is_sorted(items: Any) -> ct.BoolType:
    values = _list(items, "isSorted")
    for value in values:
        _comparable(value, "isSorted")
    return ct.BoolType(all(_compare(a, b) != 1 for a, b in itertools.pairwise(values)))


def _index_of(items: Any, item: Any) -> ct.IntType:
    values = _list(items, "indexOf")
    return ct.IntType(next((i for i, v in enumerate(values) if contained(v, item)), -1))


def _last_index_of(items: Any, item: Any) -> ct.IntType:
    values = _list(items, "lastIndexOf")
    found = (i for i in range(len(values) - 1, -1, -1) if contained(values[i], item))
    return ct.IntType(next(found, -1))


def _includes(target: Any, item: Any) -> ct.BoolType:
    if isinstance(target, list):
        return ct.BoolType(any(contained(v, item) for v in target))
    return ct.BoolType(contained(target, item))


def _slice(items: Any, start: Any, end: Any) -> ct.ListType:
    values, s, e = _list(items, "slice"), int(start), int(end)
    if s < 0 or e < 0:
        raise CelEvalError(f"cannot slice({s}, {e}), negative indexes not supported")
    if s > e:
        raise CelEvalError(
            f"cannot slice({s}, {e}), start index must be less than or equal to end index"
        )
    if len(values) < e:
        raise CelEvalError(f"cannot slice({s}, {e}), list is length {len(values)}")
    return ct.ListType(values[s:e])


def _flat(values: list[Any], depth: int) -> list[Any]:
    out: list[Any] = []
    for value in values:
        if isinstance(value, list) and depth > 0:
            out.extend(_flat(value, depth - 1))
        else:
            out.append(value)
    return out


def _flatten(items: Any, depth: Any = 1) -> ct.ListType:
    if int(depth) < 0:
        raise CelEvalError("level must be non-negative")
    return ct.ListType(_flat(_list(items, "flatten"), int(depth)))


def sort_by_keys(items: Any, keys: Any) -> ct.ListType:
    """``items`` ordered by ``keys`` (one key an item), as cel-go's ``sort`` and ``sortBy``:
    the keys must be of one comparable type."""
    values, by = _list(items, "sort"), _list(keys, "sort")
    if len(values) != len(by):
        raise CelEvalError("sortBy: expected as many keys as elements")
    if not values:
        return ct.ListType([])
    kind = _kind(by[0])
    if kind is None:
        raise CelEvalError("list elements must be comparable")
    if len(by) > 1 and any(_kind(k) != kind for k in by):
        raise CelEvalError("list elements must have the same type")

    def order(i: int, j: int) -> int:
        return _compare(by[i], by[j]) or 0

    ranked = sorted(range(len(values)), key=functools.cmp_to_key(order))
    return ct.ListType([values[i] for i in ranked])


def _distinct(items: Any) -> ct.ListType:
    unique: list[Any] = []
    for value in _list(items, "distinct"):
        if not any(contained(value, u) for u in unique):
            unique.append(value)
    return ct.ListType(unique)


def _range(n: Any) -> ct.ListType:
    size = int(n)
    if size < 0:
        raise CelEvalError(f"lists.range: size must be non-negative, got {size}")
    if size > _MAX_RANGE:
        raise CelEvalError(f"lists.range: size {size} exceeds maximum allowed ({_MAX_RANGE})")
    return ct.ListType([ct.IntType(i) for i in range(size)])


FUNCTIONS: Mapping[str, Callable[..., Any]] = returning_errors(
    {
        "sum": _sum,
        "max": _extreme("max", -1),
        "min": _extreme("min", 1),
        "isSorted": _is_sorted,
        "indexOf": _index_of,
        "lastIndexOf": _last_index_of,
        "includes": _includes,
        "slice": _slice,
        "flatten": _flatten,
        "sort": lambda items: sort_by_keys(items, items),
        "distinct": _distinct,
        "reverse": lambda items: ct.ListType(reversed(_list(items, "reverse"))),
        "lists.range": _range,
    }
)
