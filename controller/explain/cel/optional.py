"""CEL's optional values, as cel-go's optional library (``cel.OptionalTypes``) defines them.

Kubernetes has enabled the library in its base CEL environment since 1.28, so DRA selectors
may use it: ``m.?key`` and ``m[?key]`` (``optional.of(value)`` when present, else
``optional.none()``), ``optional.of``, ``optional.ofNonZeroValue``, ``optional.none``,
``optional.unwrap``, and the members ``hasValue``, ``value``, ``or``, ``orValue``,
``unwrapOpt``, ``first`` and ``last``. An unknown attribute domain is present (an empty map),
as in the scheduler. Selecting or indexing an optional selects inside it: ``none`` stays
``none``, a missing key gives ``none``. The syntax and the lazy ``or``/``orValue``,
``optMap`` and ``optFlatMap`` are in ``interpreter.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import celpy.celtypes as ct
from celpy.evaluation import CELEvalError as CelpyEvalError

from controller.explain.cel.values import Quantity, Semver


class CelOptional:
    """``optional.of(value)``, or ``optional.none()`` when ``present`` is false."""

    __slots__ = ("present", "value")

    def __init__(self, value: Any = None, present: bool = True) -> None:
        self.value = value
        self.present = present

    def __repr__(self) -> str:
        return f"optional.of({self.value!r})" if self.present else "optional.none()"


NONE = CelOptional(None, present=False)


def _index(key: Any) -> int | None:
    """A list index as cel-go takes it: an int, a uint or a whole double."""
    if isinstance(key, ct.BoolType):
        return None
    if isinstance(key, ct.IntType | ct.UintType | int):
        return int(key)
    if isinstance(key, ct.DoubleType) and float(key).is_integer():
        return int(key)
    return None


def qualify(target: Any, key: Any) -> Any:
    """``target.?key`` / ``target[?key]``: an optional, or an error value for a target that
    has no keys (a string, a number) or a list index that is not a number."""
    if isinstance(target, CelOptional):
        if not target.present:
            return NONE
        target = target.value
    if isinstance(target, CelpyEvalError):
        return target
    if isinstance(target, Mapping):
        try:
            return CelOptional(target[key])  # an unknown attribute domain is an empty map
        except KeyError:
            return NONE
    if isinstance(target, list):
        i = _index(key)
        if i is None:
            return CelpyEvalError(f"no such overload: list[?{type(key).__name__}]")
        return CelOptional(target[i]) if 0 <= i < len(target) else NONE
    return CelpyEvalError(f"{type(target).__name__} does not support field selection")


def _is_zero(value: Any) -> bool:
    if value is None or isinstance(value, ct.NullType):
        return True
    if isinstance(value, Quantity | Semver):
        return False
    if isinstance(value, ct.BoolType | ct.IntType | ct.UintType | ct.DoubleType):
        return not value
    if isinstance(value, str | bytes | list | Mapping):
        return len(value) == 0
    return False


def _optional(value: Any, name: str) -> CelOptional:
    if not isinstance(value, CelOptional):
        raise TypeError(f"no such overload: {name} needs an optional, not {type(value).__name__}")
    return value


def _value(opt: Any) -> Any:
    o = _optional(opt, "value")
    return o.value if o.present else CelpyEvalError("optional.none() dereference")


def _or(opt: Any, other: Any) -> Any:
    return opt if _optional(opt, "or").present else _optional(other, "or")


def _or_value(opt: Any, default: Any) -> Any:
    o = _optional(opt, "orValue")
    return o.value if o.present else default


def _unwrap(items: Any) -> ct.ListType:
    if not isinstance(items, list):
        raise TypeError(f"no such overload: unwrap needs a list, not {type(items).__name__}")
    return ct.ListType([o.value for o in items if _optional(o, "unwrap").present])


def _end(index: int) -> Callable[[Any], CelOptional]:
    def end(items: Any) -> CelOptional:
        if not isinstance(items, list):
            raise TypeError(f"no such overload: needs a list, not {type(items).__name__}")
        return CelOptional(items[index]) if items else NONE

    return end


OPTIONAL_FUNCTIONS: Mapping[str, Callable[..., Any]] = {
    "optional.of": CelOptional,
    "optional.ofNonZeroValue": lambda v: NONE if _is_zero(v) else CelOptional(v),
    "optional.none": lambda: NONE,
    "optional.unwrap": _unwrap,
    "hasValue": lambda o: ct.BoolType(_optional(o, "hasValue").present),
    "value": _value,
    "or": _or,
    "orValue": _or_value,
    "unwrapOpt": _unwrap,
    "first": _end(0),
    "last": _end(-1),
}
"""Called by name; ``or`` and ``orValue`` are evaluated lazily by the interpreter first."""

OPTIONAL_CALLS = frozenset(
    {"of", "ofNonZeroValue", "none", "unwrap", "optMap", "optFlatMap"}
    | {k for k in OPTIONAL_FUNCTIONS if "." not in k}
)
"""The names the optional library may call, for the undeclared-function check."""
