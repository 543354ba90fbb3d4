"""How cel-go writes values as text, for ``format`` (``lib_format.py``): Go's shortest form of a
double (``strconv.FormatFloat(f, 'g', -1, 64)``: ``1e+20``, ``1.234567e+06``, ``100``), Go's
``%q`` quoting, durations (``3600s``), timestamps (RFC 3339) and CEL type names."""

from __future__ import annotations

import datetime
import math
from decimal import Decimal
from typing import Any

import celpy.celtypes as ct

from controller.explain.cel.lib_net import CIDR, IP
from controller.explain.cel.values import Quantity, Semver


def go_float(number: float) -> str:
    """``strconv.FormatFloat(number, 'g', -1, 64)``: the shortest digits that read back as
    ``number``, in exponent form below 1e-4 and from 1e+6 (``shortest`` uses precision 6)."""
    if math.isnan(number):
        return "NaN"
    if math.isinf(number):
        return "+Inf" if number > 0 else "-Inf"
    sign = "-" if math.copysign(1.0, number) < 0 else ""
    if number == 0:
        return sign + "0"
    exact = Decimal(repr(abs(number))).normalize()
    _, digit_tuple, exponent = exact.as_tuple()
    digits = "".join(str(d) for d in digit_tuple)
    point = len(digits) + int(exponent)  # the value is 0.<digits> * 10**point
    power = point - 1
    if power < -4 or power >= 6:
        mantissa = digits[0] + ("." + digits[1:] if len(digits) > 1 else "")
        return f"{sign}{mantissa}e{'-' if power < 0 else '+'}{abs(power):02d}"
    if point <= 0:
        return f"{sign}0.{'0' * -point}{digits}"
    if point >= len(digits):
        return sign + digits + "0" * (point - len(digits))
    return f"{sign}{digits[:point]}.{digits[point:]}"


_ESCAPES = {
    "\a": "\\a",
    "\b": "\\b",
    "\f": "\\f",
    "\n": "\\n",
    "\r": "\\r",
    "\t": "\\t",
    "\v": "\\v",
    "\\": "\\\\",
    '"': '\\"',
}


def go_quote(text: str) -> str:
    """Go's ``%q`` (``strconv.Quote``): printable characters as they are, others escaped."""
    out = []
    for c in text:
        if c in _ESCAPES:
            out.append(_ESCAPES[c])
        elif c.isprintable():
            out.append(c)
        elif ord(c) < 0x80:
            out.append(f"\\x{ord(c):02x}")
        elif ord(c) < 0x10000:
            out.append(f"\\u{ord(c):04x}")
        else:
            out.append(f"\\U{ord(c):08x}")
    return '"' + "".join(out) + '"'


def is_null(value: Any) -> bool:
    return value is None or isinstance(value, ct.NullType)


def duration_text(value: datetime.timedelta) -> str:
    """cel-go's string of a duration: its seconds, shortest, then ``s`` (``-5400s``, ``1.5s``)."""
    seconds = Decimal(value.days * 86400 + value.seconds) + Decimal(value.microseconds) / 10**6
    text = format(seconds.normalize(), "f")
    return f"{text}s"


def timestamp_text(value: datetime.datetime) -> str:
    """RFC 3339 with the fraction's trailing zeros cut, in UTC (``2020-01-01T00:00:00.5Z``)."""
    utc = value.astimezone(datetime.UTC) if value.tzinfo else value
    text = utc.strftime("%Y-%m-%dT%H:%M:%S")
    if utc.microsecond:
        text += f".{utc.microsecond:06d}".rstrip("0")
    return text + "Z"


_NAMES: tuple[tuple[type | tuple[type, ...], str], ...] = (
    (ct.BoolType, "bool"),
    (ct.UintType, "uint"),
    (ct.IntType, "int"),
    (ct.DoubleType, "double"),
    (ct.StringType, "string"),
    (ct.BytesType, "bytes"),
    (ct.ListType, "list"),
    (ct.MapType, "map"),
    (ct.NullType, "null_type"),
    (ct.DurationType, "google.protobuf.Duration"),
    (ct.TimestampType, "google.protobuf.Timestamp"),
    (Quantity, "kubernetes.Quantity"),
    (Semver, "kubernetes.Semver"),
    (IP, "net.IP"),
    (CIDR, "net.CIDR"),
)


def type_name(value: Any) -> str:
    """The CEL type name of ``value``, for error messages."""
    for types, name in _NAMES:
        if isinstance(value, types):
            return name
    if is_null(value):
        return "null_type"
    return type(value).__name__


def type_value_name(value: Any) -> str | None:
    """The name a CEL type value (``type(1)``, ``int``) prints as, or None for no type."""
    if isinstance(value, type):
        for types, name in _NAMES:
            if isinstance(types, type) and issubclass(value, types):
                return name
        if value is ct.TypeType:
            return "type"
    return None
