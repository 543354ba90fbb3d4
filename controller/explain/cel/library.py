"""The Kubernetes CEL extension libraries that DRA selectors use: quantities (``quantity``,
``isQuantity``, ``compareTo``, ``add``, ...), semantic versions (``semver``, ``major``, ...) and
the strings library (``lowerAscii``, ``split``, ``substring``, ...), as :data:`FUNCTIONS`.

A function that fails (``quantity("bad")``, ``substring`` out of range) returns an error value
rather than raising, as cel-go's do, so ``||``, ``&&`` and ``?:`` absorb it when the other side
decides the result (``isQuantity(s) && quantity(s) ...``)."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from decimal import Decimal
from typing import Any

import celpy.celtypes as ct
from celpy.evaluation import CELEvalError as CelpyEvalError

from controller.explain.cel.values import CelEvalError, Quantity, Semver, returning_errors
from driver.quantity import parse_quantity


def _quantity(text: Any) -> Quantity:
    try:
        return Quantity(parse_quantity(str(text)), str(text))
    except ValueError as e:
        raise CelEvalError(str(e)) from e


def _is_quantity(text: Any) -> ct.BoolType:
    try:
        parse_quantity(str(text))
    except ValueError:
        return ct.BoolType(False)
    return ct.BoolType(True)


def _semver(text: Any, normalize: Any = False) -> Semver:
    raw = str(text)
    if normalize:
        raw = raw.removeprefix("v")
        parts = re.split(r"([-+])", raw, maxsplit=1)
        nums = parts[0].split(".")
        nums += ["0"] * (3 - len(nums))
        raw = ".".join(str(int(n)) if n.isdigit() else n for n in nums) + "".join(parts[1:])
    return Semver(raw)


def _is_semver(text: Any, normalize: Any = False) -> ct.BoolType:
    try:
        _semver(text, normalize)
    except (CelEvalError, ValueError):
        return ct.BoolType(False)
    return ct.BoolType(True)


def _ordered(a: Any, b: Any, name: str) -> tuple[Any, Any]:
    if isinstance(a, Quantity) and isinstance(b, Quantity):
        return a.value, b.value
    if isinstance(a, Semver) and isinstance(b, Semver):
        return a._key(), b._key()
    raise CelEvalError(
        f"no such overload: {name}({type(a).__name__}, {type(b).__name__}): "
        "both sides must be quantities or both semantic versions"
    )


def _compare_to(a: Any, b: Any) -> ct.IntType:
    x, y = _ordered(a, b, "compareTo")
    return ct.IntType((x > y) - (x < y))


def _greater(a: Any, b: Any) -> ct.BoolType:
    x, y = _ordered(a, b, "isGreaterThan")
    return ct.BoolType(x > y)


def _less(a: Any, b: Any) -> ct.BoolType:
    x, y = _ordered(a, b, "isLessThan")
    return ct.BoolType(x < y)


def _as_quantity(value: Any, name: str) -> Quantity:
    if isinstance(value, Quantity):
        return value
    if isinstance(value, ct.IntType | int) and not isinstance(value, bool):
        return Quantity(Decimal(int(value)), str(int(value)))
    raise CelEvalError(f"no such overload: {name} needs a quantity, not {type(value).__name__}")


def _add(a: Any, b: Any) -> Quantity:
    x, y = _as_quantity(a, "add"), _as_quantity(b, "add")
    v = x.value + y.value
    return Quantity(v, str(v))


def _sub(a: Any, b: Any) -> Quantity:
    x, y = _as_quantity(a, "sub"), _as_quantity(b, "sub")
    v = x.value - y.value
    return Quantity(v, str(v))


def _sign(a: Any) -> ct.IntType:
    v = _as_quantity(a, "sign").value
    return ct.IntType((v > 0) - (v < 0))


def _is_integer(a: Any) -> ct.BoolType:
    v = _as_quantity(a, "isInteger").value
    return ct.BoolType(v == v.to_integral_value() and abs(v) < 2**63)


def _as_integer(a: Any) -> ct.IntType:
    v = _as_quantity(a, "asInteger").value
    if v != v.to_integral_value() or abs(v) >= 2**63:
        raise CelEvalError(f"quantity {v} is not an integer that fits into int64")
    return ct.IntType(int(v))


def _as_float(a: Any) -> ct.DoubleType:
    return ct.DoubleType(float(_as_quantity(a, "asApproximateFloat").value))


def _version_part(index: int, name: str) -> Callable[[Any], ct.IntType]:
    def part(v: Any) -> ct.IntType:
        if not isinstance(v, Semver):
            raise CelEvalError(f"no such overload: {name} needs a semantic version")
        return ct.IntType(v.core[index])

    return part


def _string(value: Any, name: str) -> str:
    if not isinstance(value, ct.StringType | str):
        raise CelEvalError(f"no such overload: {name} needs a string, not {type(value).__name__}")
    return str(value)


def _lower(s: Any) -> ct.StringType:
    text = _string(s, "lowerAscii")
    return ct.StringType("".join(c.lower() if c.isascii() else c for c in text))


def _upper(s: Any) -> ct.StringType:
    text = _string(s, "upperAscii")
    return ct.StringType("".join(c.upper() if c.isascii() else c for c in text))


def _trim(s: Any) -> ct.StringType:
    return ct.StringType(_string(s, "trim").strip())


def _replace(s: Any, old: Any, new: Any, n: Any = -1) -> ct.StringType:
    return ct.StringType(_string(s, "replace").replace(str(old), str(new), int(n)))


def _split(s: Any, sep: Any, n: Any = -1) -> ct.ListType:
    text = _string(s, "split")
    limit = int(n)
    if limit == 0:
        return ct.ListType([])
    parts = text.split(str(sep), limit - 1 if limit > 0 else -1)
    return ct.ListType([ct.StringType(p) for p in parts])


def _join(items: Any, sep: Any = "") -> ct.StringType:
    return ct.StringType(str(sep).join(str(i) for i in items))


def _offset(text: str, sub: str, offset: Any) -> Any:
    """cel-go's answer for a search from ``offset`` that it settles without searching (an
    error value for a negative offset), else None."""
    at = int(offset)
    if at < 0:
        return CelpyEvalError(f"index out of range: {at}")
    if not sub:
        return ct.IntType(min(at, len(text)))
    return ct.IntType(-1) if at >= len(text) else None


def _index_of(s: Any, sub: Any, start: Any = 0) -> Any:
    text, part = _string(s, "indexOf"), str(sub)
    settled = _offset(text, part, start)
    return ct.IntType(text.find(part, int(start))) if settled is None else settled


def _last_index_of(s: Any, sub: Any, start: Any = None) -> Any:
    text, part = _string(s, "lastIndexOf"), str(sub)
    if start is None:
        return ct.IntType(text.rfind(part))
    settled = _offset(text, part, start)
    if settled is not None:
        return settled
    return ct.IntType(text.rfind(part, 0, int(start) + len(part)))


def _substring(s: Any, start: Any, end: Any = None) -> ct.StringType:
    text = _string(s, "substring")
    stop = len(text) if end is None else int(end)
    if not 0 <= int(start) <= stop <= len(text):
        raise CelEvalError(f"substring({start}, {stop}) is out of range for {text!r}")
    return ct.StringType(text[int(start) : stop])


def _char_at(s: Any, i: Any) -> ct.StringType:
    text = _string(s, "charAt")
    if not 0 <= int(i) <= len(text):
        raise CelEvalError(f"charAt({i}) is out of range for {text!r}")
    return ct.StringType(text[int(i) : int(i) + 1])


_FUNCTIONS: Mapping[str, Callable[..., Any]] = {
    "quantity": _quantity,
    "isQuantity": _is_quantity,
    "semver": _semver,
    "isSemver": _is_semver,
    "compareTo": _compare_to,
    "isGreaterThan": _greater,
    "isLessThan": _less,
    "add": _add,
    "sub": _sub,
    "sign": _sign,
    "isInteger": _is_integer,
    "asInteger": _as_integer,
    "asApproximateFloat": _as_float,
    "major": _version_part(0, "major"),
    "minor": _version_part(1, "minor"),
    "patch": _version_part(2, "patch"),
    "lowerAscii": _lower,
    "upperAscii": _upper,
    "trim": _trim,
    "replace": _replace,
    "split": _split,
    "join": _join,
    "indexOf": _index_of,
    "lastIndexOf": _last_index_of,
    "substring": _substring,
    "charAt": _char_at,
}
# a failure is a CEL error value, which ``||`` and ``&&`` can absorb (values.returning_errors)
FUNCTIONS: Mapping[str, Callable[..., Any]] = returning_errors(_FUNCTIONS)
