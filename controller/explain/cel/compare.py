"""cel-go's ``==``, ``!=``, ``in`` and orderings, which the scheduler runs, over
cel-python's: values of different types are unequal rather than an error, numbers compare
across int, uint and double. ``||`` and ``&&`` of two errors are the first one (cel-python
fails to format them and crashes). :data:`OPERATORS` replaces cel-python's."""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping
from typing import Any

import celpy
import celpy.celtypes as ct
from celpy.evaluation import CELEvalError as CelpyEvalError

from controller.explain.cel.lib_net import CIDR, IP
from controller.explain.cel.optional import CelOptional
from controller.explain.cel.values import Quantity, Semver

# values that only equal their own type: another type is an error, not unequal
_STRICT = (Quantity, Semver, IP, CIDR)


def _number(value: Any) -> bool:
    return isinstance(value, ct.IntType | ct.UintType | ct.DoubleType)


def _plain(value: Any) -> int | float:
    return float(value) if isinstance(value, ct.DoubleType) else int(value)


def _is_null(value: Any) -> bool:
    return value is None or isinstance(value, ct.NullType)


def _equal(a: Any, b: Any) -> bool:
    """cel-go's ``==``, which the scheduler runs: values of different types are unequal (an
    int attribute compared with a string is false, not an error; a bool is never equal to a
    number), numbers compare by value across int, uint and double; only a quantity or
    semantic version (or IP, CIDR) compared with another type is an error (TypeError: no such
    overload)."""
    if _is_null(a) or _is_null(b):
        return _is_null(a) and _is_null(b)
    if isinstance(a, CelOptional) or isinstance(b, CelOptional):
        if not (isinstance(a, CelOptional) and isinstance(b, CelOptional)):
            return False
        return a.present == b.present and (not a.present or _equal(a.value, b.value))
    if isinstance(a, _STRICT):
        if type(a) is not type(b):
            raise TypeError(f"no such overload: {type(a).__name__} == {type(b).__name__}")
        return bool(a == b)
    if isinstance(a, ct.BoolType) or isinstance(b, ct.BoolType):
        return isinstance(a, ct.BoolType) and isinstance(b, ct.BoolType) and bool(a) == bool(b)
    if _number(a) or _number(b):
        return _number(a) and _number(b) and _plain(a) == _plain(b)
    if isinstance(a, list) or isinstance(b, list):
        return (
            isinstance(a, list)
            and isinstance(b, list)
            and len(a) == len(b)
            and all(_equal(x, y) for x, y in zip(a, b, strict=True))
        )
    if isinstance(a, Mapping) or isinstance(b, Mapping):
        return (
            isinstance(a, Mapping)
            and isinstance(b, Mapping)
            and a.keys() == b.keys()
            and all(_equal(v, b[k]) for k, v in a.items())
        )
    if type(a) is not type(b) and not (isinstance(a, str) and isinstance(b, str)):
        return False
    try:
        return bool(a == b)
    except TypeError:
        return False


def _eq(a: Any, b: Any) -> Any:
    if isinstance(a, CelpyEvalError):
        return a
    if isinstance(b, CelpyEvalError):
        return b
    return ct.BoolType(_equal(a, b))


def _ne(a: Any, b: Any) -> Any:
    if isinstance(a, CelpyEvalError):
        return a
    if isinstance(b, CelpyEvalError):
        return b
    return ct.BoolType(not _equal(a, b))


def contained(item: Any, value: Any) -> bool:
    """Whether ``item`` equals ``value`` as cel-go's list membership tests it: an error (a
    quantity against a number) is no match."""
    try:
        return _equal(item, value)
    except TypeError:
        return False


def _in(item: Any, container: Any) -> Any:
    """``x in list`` tests each element with cel-go's ``==``, an element of another type
    being no match; maps keep cel-python's key lookup."""
    if isinstance(item, CelpyEvalError):
        return item
    if isinstance(container, CelpyEvalError):
        return container
    if isinstance(container, list):
        return ct.BoolType(any(contained(item, x) for x in container))
    return celpy.evaluation.operator_in(item, container)


def _ordering(
    base: Callable[[Any, Any], Any], op: Callable[[Any, Any], bool]
) -> Callable[..., Any]:
    """``<`` and friends; numbers of different types compare by value, as with the
    scheduler's cross-type numeric comparisons (``numaNode < 1.5``)."""

    def compare(a: Any, b: Any) -> Any:
        if _number(a) and _number(b) and type(a) is not type(b):
            return ct.BoolType(op(_plain(a), _plain(b)))
        return base(a, b)

    return compare


def _logical(decides: bool) -> Callable[[Any, Any], Any]:
    """``||`` (``decides``: true) or ``&&`` (false), as cel-go: an operand equal to
    ``decides`` is the result, else the first operand that is no bool (an error value, or no
    such overload), else the other bool."""

    def combine(a: Any, b: Any) -> Any:
        for value in (a, b):
            if isinstance(value, ct.BoolType) and bool(value) is decides:
                return value
        for value in (a, b):
            if isinstance(value, CelpyEvalError):
                return value
            if not isinstance(value, ct.BoolType):
                return CelpyEvalError(f"no such overload: {type(value).__name__} in a condition")
        return ct.BoolType(not decides)

    return combine


OPERATORS: Mapping[str, Callable[..., Any]] = {
    "_||_": _logical(True),
    "_&&_": _logical(False),
    "_==_": _eq,
    "_!=_": _ne,
    "_in_": _in,
    "_<_": _ordering(celpy.evaluation.bool_lt, operator.lt),
    "_<=_": _ordering(celpy.evaluation.bool_le, operator.le),
    "_>_": _ordering(celpy.evaluation.bool_gt, operator.gt),
    "_>=_": _ordering(celpy.evaluation.bool_ge, operator.ge),
}
