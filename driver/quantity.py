"""Kubernetes resource quantities (``512Mi``, ``10G``, ``100m``, ``1e9``) as exact Decimals.

The grammar is the API server's (``k8s.io/apimachinery/pkg/api/resource``): an optional
sign, digits with an optional decimal point, then at most one suffix: binary
(``Ki Mi Gi Ti Pi Ei``), decimal (``n u m k M G T P E``) or a decimal exponent
(``e3``, ``E-2``). Unlike the Python ``kubernetes`` client this refuses what the API
server refuses: surrounding spaces, ``_`` digit separators, ``K`` for kilo, ``Infinity``
and ``NaN``.
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


def parse_quantity(value: str | int | Decimal) -> Decimal:
    """The exact value of ``value``; ValueError naming it when it is not a quantity."""
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a quantity")
    if isinstance(value, int | Decimal):
        if isinstance(value, Decimal) and not value.is_finite():
            raise ValueError(f"{value!r} is not a quantity")
        return Decimal(value)
    if not isinstance(value, str):
        raise ValueError(f"{value!r} is not a quantity")
    m = _QUANTITY.fullmatch(value)
    if m is None:
        raise ValueError(
            f"{value!r} is not a quantity (a number with an optional suffix such as "
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
