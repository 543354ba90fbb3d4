"""``"...".format([args])`` and ``strings.quote(s)`` of cel-go's strings library, version 2 (the
one Kubernetes enables), as :data:`FUNCTIONS`, writing what cel-go writes: ``%s`` (lists and
maps in CEL syntax, a double in Go's shortest form), ``%d``, ``%x``/``%X``, ``%o``, ``%b``,
``%f`` (en_US: ``1,234.500000``, ``∞``) and ``%e`` (``1.234500``, a multiplication sign, ``10``
and a superscript exponent; the precision read as a width, as cel-go's locale printer does),
``%%``; a clause given the wrong type is an error.
Doubles, durations and timestamps are written by :mod:`lib_format_values`."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import celpy.celtypes as ct

from controller.explain.cel.lib_format_values import (
    duration_text,
    go_float,
    go_quote,
    is_null,
    timestamp_text,
    type_name,
    type_value_name,
)
from controller.explain.cel.values import CelEvalError, returning_errors

_SUPERSCRIPT = str.maketrans("0123456789-", "⁰¹²³⁴⁵⁶⁷⁸⁹⁻")
_STRING_CLAUSE = (
    "string clause can only be used on strings, bools, bytes, ints, doubles, maps, lists, "
    "types, durations, and timestamps, was given {}"
)


def _utf8(value: bytes) -> str:
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError as e:
        raise CelEvalError(
            'could not convert argument "invalid UTF-8 in bytes, cannot convert to string" '
            "to string"
        ) from e


def _plain(value: Any) -> str:
    """``%s``: cel-go's ``FormatString``."""
    if isinstance(value, list):
        return "[" + ", ".join(_element(v) for v in value) + "]"
    if isinstance(value, Mapping):
        return _map(value)
    if is_null(value):
        return "null"
    if isinstance(value, ct.BoolType | bool):
        return "true" if value else "false"
    if isinstance(value, ct.DoubleType | float):
        return go_float(float(value))
    if isinstance(value, ct.IntType | ct.UintType | int):
        return str(int(value))
    if isinstance(value, str):
        return str(value)
    if isinstance(value, bytes):
        return _utf8(value)
    if isinstance(value, ct.DurationType):
        return duration_text(value)
    if isinstance(value, ct.TimestampType):
        return timestamp_text(value)
    name = type_value_name(value)
    if name is not None:
        return name
    raise CelEvalError(_STRING_CLAUSE.format(type_name(value)))


def _element(value: Any) -> str:
    """A list element or map value: cel-go's ``clauseForType`` then ``quoteForCEL``."""
    if isinstance(value, ct.DoubleType | float) and not isinstance(value, bool):
        number = float(value)
        if math.isnan(number) or math.isinf(number):
            return go_quote("NaN" if math.isnan(number) else ("+Inf" if number > 0 else "-Inf"))
        return f"{number:.6f}"
    if isinstance(value, ct.DurationType):
        return f'duration("{duration_text(value)}")'
    if isinstance(value, ct.TimestampType):
        return f'timestamp("{timestamp_text(value)}")'
    if isinstance(value, str):
        return go_quote(str(value))
    if isinstance(value, bytes):
        return "b" + go_quote(_utf8(value))
    known = (list, Mapping, ct.BoolType, ct.IntType, ct.UintType, bool, int, ct.NullType)
    if isinstance(value, known) or is_null(value) or type_value_name(value) is not None:
        return _plain(value)
    raise CelEvalError(f"no formatting function for {type_name(value)}")


def _map(value: Mapping[Any, Any]) -> str:
    pairs = []
    for key, item in value.items():
        if not isinstance(key, str | ct.BoolType | ct.IntType | ct.UintType | int):
            raise CelEvalError(f"no formatting function for map key of type {type_name(key)}")
        text = go_quote(str(key)) if isinstance(key, str) else _plain(key)
        pairs.append((text, _element(item)))
    pairs.sort(key=lambda pair: pair[0])
    return "{" + ", ".join(f"{k}:{v}" for k, v in pairs) + "}"


def _integer(value: Any) -> int | None:
    if isinstance(value, ct.IntType | ct.UintType) or (
        isinstance(value, int) and not isinstance(value, bool | ct.BoolType)
    ):
        return int(value)
    return None


def _decimal(value: Any, _: int | None) -> str:
    number = _integer(value)
    if number is None:
        raise CelEvalError(
            f"decimal clause can only be used on integers, was given {type_name(value)}"
        )
    return str(number)


def _double(value: Any, clause: str) -> float:
    if isinstance(value, ct.DoubleType | float) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, str) and value in {"NaN", "Infinity", "-Infinity"}:
        return float(value.replace("Infinity", "inf"))
    raise CelEvalError(f"{clause} clause can only be used on doubles, was given {type_name(value)}")


def _special(number: float) -> str | None:
    if math.isnan(number):
        return "NaN"
    if math.isinf(number):
        return "∞" if number > 0 else "-∞"
    return None


def _fixed(value: Any, precision: int | None) -> str:
    number = _double(value, "fixed-point")
    special = _special(number)
    if special is not None:
        return special
    return f"{abs(number) if number == 0 else number:,.{6 if precision is None else precision}f}"


def _scientific(value: Any, precision: int | None) -> str:
    """``%e`` as cel-go's locale printer writes it: six decimals, a superscript exponent,
    and the precision taken for a width (``"%.10e"`` pads to ten characters)."""
    number = _double(value, "scientific")
    text = _special(number)
    if text is None:
        mantissa, _, exponent = f"{abs(number):.6e}".partition("e")
        digits = f"{'-' if exponent.startswith('-') else ''}{int(exponent[1:]):02d}"
        sign = "-" if number < 0 else ""
        text = f"{sign}{mantissa}\u00d710{digits.translate(_SUPERSCRIPT)}"
    return text.rjust(6 if precision is None else precision)


def _binary(value: Any, _: int | None) -> str:
    if isinstance(value, ct.BoolType | bool):
        return "1" if value else "0"
    number = _integer(value)
    if number is None:
        raise CelEvalError(
            "only integers and bools can be formatted as binary, was given " + type_name(value)
        )
    return f"{number:b}"


def _hex(upper: bool) -> Callable[[Any, int | None], str]:
    def call(value: Any, _: int | None) -> str:
        number = _integer(value)
        if number is not None:
            text = f"{number:x}"
        elif isinstance(value, str):
            text = str(value).encode("utf-8").hex()
        elif isinstance(value, bytes):
            text = bytes(value).hex()
        else:
            raise CelEvalError(
                "only integers, byte buffers, and strings can be formatted as hex, was given "
                + type_name(value)
            )
        return text.upper() if upper else text

    return call


def _octal(value: Any, _: int | None) -> str:
    number = _integer(value)
    if number is None:
        raise CelEvalError(
            f"octal clause can only be used on integers, was given {type_name(value)}"
        )
    return f"{number:o}"


_CLAUSES: Mapping[str, Callable[[Any, int | None], str]] = {
    "s": lambda value, _: _plain(value),
    "d": _decimal,
    "f": _fixed,
    "e": _scientific,
    "b": _binary,
    "x": _hex(upper=False),
    "X": _hex(upper=True),
    "o": _octal,
}


def _clause(text: str, start: int) -> tuple[int, Callable[[Any, int | None], str], int | None]:
    """The clause after the ``%`` at ``start - 1``: where it ends, its writer, its precision."""
    i, precision = start, None
    if text[i] == ".":
        i += 1
        digits = ""
        while True:
            if i >= len(text):
                raise CelEvalError(
                    "could not parse formatting clause: error while parsing precision: "
                    "could not find end of precision specifier"
                )
            if not ("0" <= text[i] <= "9"):
                break
            digits += text[i]
            i += 1
        if not digits:
            raise CelEvalError(
                "could not parse formatting clause: error while parsing precision: error while "
                'converting precision to integer: strconv.Atoi: parsing "": invalid syntax'
            )
        precision = int(digits)
    writer = _CLAUSES.get(text[i])
    if writer is None:
        raise CelEvalError(
            f'could not parse formatting clause: unrecognized formatting clause "{text[i]}"'
        )
    return i + 1, writer, precision


def _format(template: Any, args: Any) -> ct.StringType:
    if not isinstance(template, str) or not isinstance(args, list):
        raise TypeError("no such overload: format needs a string and a list")
    text, out, i, index = str(template), [], 0, 0
    while i < len(text):
        if text[i] != "%":
            out.append(text[i])
            i += 1
            continue
        if i + 1 < len(text) and text[i + 1] == "%":
            out.append("%")
            i += 2
            continue
        if index >= len(args):
            raise CelEvalError(f"index {index} out of range")
        if i + 1 >= len(text):
            raise CelEvalError("unexpected end of string")
        i, writer, precision = _clause(text, i + 1)
        try:
            out.append(writer(args[index], precision))
        except CelEvalError as e:
            raise CelEvalError(f"error during formatting: {e}") from e
        index += 1
    return ct.StringType("".join(out))


def _quote(text: Any) -> ct.StringType:
    """``strings.quote``: the string in double quotes, CEL's escapes escaped."""
    if not isinstance(text, str):
        raise TypeError("no such overload: strings.quote needs a string")
    escapes = {"\a": "\\a", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t"}
    escapes |= {"\v": "\\v", "\\": "\\\\", '"': '\\"'}
    body = "".join(escapes.get(c, "\ufffd" if 0xD800 <= ord(c) < 0xE000 else c) for c in text)
    return ct.StringType(f'"{body}"')


FUNCTIONS: Mapping[str, Callable[..., Any]] = returning_errors(
    {"format": _format, "strings.quote": _quote}
)
