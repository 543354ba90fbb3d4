"""Quantity parsing agrees with the Kubernetes client where the API server's grammar does,
and refuses what the API server refuses."""

from __future__ import annotations

from collections.abc import Callable
from decimal import Decimal

import pytest
from kubernetes.utils import parse_quantity as _client_parse

from driver.quantity import parse_quantity

client_parse: Callable[[str], Decimal] = _client_parse  # the Python kubernetes client's

AGREED = [
    "0", "1", "-1", "+1", "007", "1.5", "1.", ".5", "-.5", "0.000001",
    "123456789012345678", "1n", "1u", "1m", "100m", "1500m", "1k", "1M", "1G", "1T",
    "1P", "1E", "1Ki", "1Mi", "1Gi", "80Gi", "1.5Gi", "0.5Mi", "1Ti", "1Pi", "1Ei",
    "-2Gi", "1e3", "1E3", "1e-3", "1E+2", "2.5e9", "1e0", "12e-9", "81559873536",
    "40960Mi", "3.25k", "+.5Ki",
]  # fmt: skip

BOTH_REFUSE = [
    "", "Gi", "1.2.3", "1ki", "1mi", "1ni", "1ui", "1Kib", "1iB", "abc", "--1",
    "1GiB", "e3", "1e", "0x10", "1Qi",
]  # fmt: skip

# The Python client hands these to Decimal(), which is laxer than the API server.
ONLY_THE_API_SERVER_REFUSES = [
    " 1Gi",
    "1 Gi",
    "1e3Gi",
    "1Gi ",
    "1_000",
    "1K",
    "Infinity",
    "NaN",
    "-inf",
]


@pytest.mark.parametrize("text", AGREED)
def test_agrees_with_the_kubernetes_client(text: str) -> None:
    assert parse_quantity(text) == client_parse(text)


@pytest.mark.parametrize("text", BOTH_REFUSE + ONLY_THE_API_SERVER_REFUSES)
def test_refuses_what_the_api_server_refuses(text: str) -> None:
    with pytest.raises(ValueError, match="is not a quantity") as e:
        parse_quantity(text)
    assert repr(text) in str(e.value)


@pytest.mark.parametrize("text", BOTH_REFUSE)
def test_the_kubernetes_client_refuses_these_too(text: str) -> None:
    with pytest.raises(ValueError):
        client_parse(text)


def test_values_are_exact() -> None:
    assert parse_quantity("80Gi") == 80 * 2**30
    assert parse_quantity("1.5Gi") == 3 * 2**29
    assert parse_quantity("100m") == Decimal("0.1")
    assert parse_quantity("1e9") == 10**9
    assert parse_quantity("12e-9") == Decimal("0.000000012")


def test_numbers_pass_through_and_other_types_are_refused() -> None:
    assert parse_quantity(7) == 7
    assert parse_quantity(Decimal("2.5")) == Decimal("2.5")
    for bad in (True, 1.5, None, Decimal("NaN")):
        with pytest.raises(ValueError, match="is not a quantity"):
            parse_quantity(bad)  # type: ignore[arg-type]


def test_an_absurd_exponent_is_refused() -> None:
    with pytest.raises(ValueError, match="exponent is out of range"):
        parse_quantity("1e99999")


@pytest.mark.parametrize("text", ["1e5000", "8Ei", "-1e19", "9" * 30, "10000P"])
def test_quantities_beyond_int64_are_refused_naming_the_field(text: str) -> None:
    with pytest.raises(ValueError, match=r"^spec\.x: .* is out of range: a quantity may be"):
        parse_quantity(text, field="spec.x")
    with pytest.raises(ValueError, match="out of range"):
        parse_quantity(-(2**63))


def test_the_largest_quantity_is_kept() -> None:
    assert parse_quantity(str(2**63 - 1)) == 2**63 - 1
    assert parse_quantity("7Ei") == 7 * 2**60
