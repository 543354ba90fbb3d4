"""Kubernetes resource quantities (``512Mi``, ``10G``, ``100m``, ``1e9``) as exact Decimals.

The grammar is the API server's (``k8s.io/apimachinery/pkg/api/resource``): an optional
sign, digits with an optional decimal point, then at most one suffix: binary
(``Ki Mi Gi Ti Pi Ei``), decimal (``n u m k M G T P E``) or a decimal exponent
(``e3``, ``E-2``). Unlike the Python ``kubernetes`` client this refuses what the API
server refuses: surrounding spaces, ``_`` digit separators, ``K`` for kilo, ``Infinity``
and ``NaN``.

Every quantity is bounded: its magnitude may not exceed :data:`MAX_QUANTITY` (2^63 - 1, the
largest value the API server keeps exactly). A bigger one (``1e5000``) is refused here,
naming the field, instead of turning into an integer of thousands of digits that fails
later, far from the claim (Python refuses to print integers of more than 4300 digits).
"""

from __future__ import annotations

import re
from decimal import Decimal

_BINARY = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
_DECIMAL = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_QUANTITY = re.compile(
    r"(?P<number>[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))"
    r"(?:(?P<binary>[KMGTPE]i)|[eE](?P<exponent>[+-]?[0-9]+)|(?P<decimal>[numkMGTPE]?))"
)
_MAX_EXPONENT = 10_000
MAX_QUANTITY = Decimal(2**63 - 1)


def parse_quantity(value: str | int | Decimal, field: str = "") -> Decimal:
    """The exact value of ``value``; ValueError naming it (and ``field``, when given) when it is
    not a quantity or its magnitude exceeds :data:`MAX_QUANTITY`."""
    where = f"{field}: " if field else ""
    try:
        amount = _parse(value)
    except ValueError as e:
        raise ValueError(f"{where}{e}") from e
    if abs(amount) > MAX_QUANTITY:
        raise ValueError(
            f"{where}{_short(value)} is out of range: a quantity may be at most 2^63-1 "
            "(about 9.2E18, just under 8Ei)"
        )
    return amount


def _short(value: object) -> str:
    text = repr(value) if isinstance(value, str) else "a number"
    return text if len(text) <= 40 else text[:37] + "..."


def _parse(value: str | int | Decimal) -> Decimal:
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a quantity")
    if isinstance(value, int | Decimal):
        if isinstance(value, Decimal) and not value.is_finite():
            raise ValueError(f"{value!r} is not a quantity")
        return Decimal(value)
    if not isinstance(value, str):
        raise ValueError(f"{type(value).__name__} is not a quantity")
    if len(value) > 200:
        raise ValueError(f"{value[:37]!r}... ({len(value)} characters) is not a quantity")
    m = _QUANTITY.fullmatch(value)
    if m is None:
        raise ValueError(
            f"{_short(value)} is not a quantity (a number with an optional suffix such as "
            "Ki, Mi, Gi, m, k, M, G or an exponent like e9)"
        )
    number = Decimal(m["number"])
    if m["binary"]:
        return number * (1 << _BINARY[m["binary"]])
    if m["exponent"] is not None:
        exponent = int(m["exponent"])
        if abs(exponent) > _MAX_EXPONENT:
            raise ValueError(f"{value!r}: the exponent is out of range")
        return number.scaleb(exponent)
    return number.scaleb(_DECIMAL[m["decimal"]])
