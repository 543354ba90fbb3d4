"""Kubernetes' IP and CIDR CEL libraries (``ip("10.0.0.1")``, ``cidr("10.0.0.0/8")``, in the
API server's base environment since 1.30), as :data:`FUNCTIONS`: addresses parse as Go's
``netip`` does (no zone, no IPv4-mapped IPv6 address, no leading zeros) and the predicates
(``isLoopback``, ``isGlobalUnicast``, ...) are Go's, so a private address is global unicast."""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable, Mapping
from typing import Any

import celpy.celtypes as ct

from controller.explain.cel.values import CelEvalError, returning_errors

Address = ipaddress.IPv4Address | ipaddress.IPv6Address


def _parse_address(raw: str) -> Address:
    """``raw`` as Go's ``netip.ParseAddr`` reads it, with Kubernetes' two refusals."""
    try:
        addr = ipaddress.ip_address(raw)
    except ValueError as e:
        why = f"IP Address {raw!r} parse error during conversion from string: {e}"
        raise CelEvalError(why) from e
    if isinstance(addr, ipaddress.IPv6Address):
        if addr.scope_id is not None:
            raise CelEvalError(f"IP address {raw!r} with zone value is not allowed")
        if addr.ipv4_mapped is not None:
            raise CelEvalError(f"IPv4-mapped IPv6 address {raw!r} is not allowed")
    return addr


class IP:
    """An address in CEL: ``ip("10.0.0.1")``, ``cidr(...).ip()``."""

    __slots__ = ("addr",)

    def __init__(self, addr: Address) -> None:
        self.addr = addr

    def __eq__(self, other: object) -> bool:
        return isinstance(other, IP) and self.addr == other.addr

    def __hash__(self) -> int:
        return hash(self.addr)

    def __str__(self) -> str:
        return str(self.addr)

    def __repr__(self) -> str:
        return f"ip({str(self.addr)!r})"


_BITS = re.compile(r"^(0|[1-9][0-9]{0,2})$")


class CIDR:
    """A prefix in CEL: ``cidr("10.0.0.0/8")``; like Go's ``netip.Prefix`` it keeps the
    address as written (``cidr("10.1.2.3/8")`` is not ``cidr("10.0.0.0/8")``)."""

    __slots__ = ("addr", "bits")

    def __init__(self, addr: Address, bits: int) -> None:
        self.addr = addr
        self.bits = bits

    @classmethod
    def parse(cls, raw: str) -> CIDR:
        def fail(why: str) -> CelEvalError:
            return CelEvalError(
                "network address parse error during conversion from string: network address "
                f"parse error during conversion from string: netip.ParsePrefix({raw!r}): {why}"
            )

        text, slash, bits = raw.rpartition("/")
        if not slash:
            raise fail("no '/'")
        try:
            addr = ipaddress.ip_address(text)
        except ValueError as e:
            raise fail(str(e)) from e
        if isinstance(addr, ipaddress.IPv6Address) and addr.scope_id is not None:
            raise fail("IPv6 zones cannot be present in a prefix")
        if not _BITS.match(bits) or int(bits) > addr.max_prefixlen:
            raise fail(f"bad bits after slash: {bits!r}")
        if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
            raise CelEvalError(
                "network address parse error during conversion from string: "
                f"IPv4-mapped IPv6 address {raw!r} is not allowed"
            )
        return cls(addr, int(bits))

    def masked(self) -> CIDR:
        width = self.addr.max_prefixlen
        mask = ((1 << self.bits) - 1) << (width - self.bits)
        return CIDR(ipaddress.ip_address(int(self.addr) & mask), self.bits)

    def contains(self, addr: Address) -> bool:
        if addr.version != self.addr.version:
            return False
        shift = self.addr.max_prefixlen - self.bits
        return int(addr) >> shift == int(self.addr) >> shift

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CIDR) and (self.addr, self.bits) == (other.addr, other.bits)

    def __hash__(self) -> int:
        return hash((self.addr, self.bits))

    def __str__(self) -> str:
        return f"{self.addr}/{self.bits}"

    def __repr__(self) -> str:
        return f"cidr({str(self)!r})"


def _string(value: Any, name: str) -> str:
    if not isinstance(value, str):
        raise TypeError(f"no such overload: {name}({type(value).__name__})")
    return str(value)


def _ip(value: Any) -> IP:
    """``ip(string)``, and ``cidr.ip()``: the prefix's address."""
    if isinstance(value, CIDR):
        return IP(value.addr)
    return IP(_parse_address(_string(value, "ip")))


def _is_ip(value: Any) -> ct.BoolType:
    try:
        _parse_address(_string(value, "isIP"))
    except CelEvalError:
        return ct.BoolType(False)
    return ct.BoolType(True)


def _is_canonical(value: Any) -> ct.BoolType:
    text = _string(value, "ip.isCanonical")
    return ct.BoolType(str(_parse_address(text)) == text)


def _address(value: Any, name: str) -> Address:
    if not isinstance(value, IP):
        raise TypeError(f"no such overload: {name} needs an IP, not {type(value).__name__}")
    return value.addr


def _family(value: Any) -> ct.IntType:
    return ct.IntType(_address(value, "family").version)


def _unspecified(addr: Address) -> bool:
    return int(addr) == 0


def _loopback(addr: Address) -> bool:
    if addr.version == 4:
        return int(addr) >> 24 == 127
    return int(addr) == 1


def _multicast(addr: Address) -> bool:
    if addr.version == 4:
        return int(addr) >> 28 == 0xE
    return int(addr) >> 120 == 0xFF


def _link_local_multicast(addr: Address) -> bool:
    if addr.version == 4:
        return int(addr) >> 8 == 0xE00000  # 224.0.0.0/24
    return (int(addr) >> 112) & 0xFF0F == 0xFF02


def _link_local_unicast(addr: Address) -> bool:
    if addr.version == 4:
        return int(addr) >> 16 == 0xA9FE  # 169.254.0.0/16
    return (int(addr) >> 112) & 0xFFC0 == 0xFE80


def _global_unicast(addr: Address) -> bool:
    """Go's ``IsGlobalUnicast``: private addresses and ULAs count."""
    if addr.version == 4 and int(addr) == 0xFFFFFFFF:
        return False
    return not (
        _unspecified(addr) or _loopback(addr) or _multicast(addr) or _link_local_unicast(addr)
    )


def _predicate(test: Callable[[Address], bool], name: str) -> Callable[[Any], ct.BoolType]:
    def call(value: Any) -> ct.BoolType:
        return ct.BoolType(test(_address(value, name)))

    return call


def _cidr(value: Any) -> CIDR:
    return CIDR.parse(_string(value, "cidr"))


def _is_cidr(value: Any) -> ct.BoolType:
    try:
        _cidr(value)
    except CelEvalError:
        return ct.BoolType(False)
    return ct.BoolType(True)


def _prefix(value: Any, name: str) -> CIDR:
    if not isinstance(value, CIDR):
        raise TypeError(f"no such overload: {name} needs a CIDR, not {type(value).__name__}")
    return value


def _contains_ip(prefix: Any, other: Any) -> ct.BoolType:
    address = other if isinstance(other, IP) else _ip(_string(other, "containsIP"))
    return ct.BoolType(_prefix(prefix, "containsIP").contains(address.addr))


def _contains_cidr(prefix: Any, other: Any) -> ct.BoolType:
    outer = _prefix(prefix, "containsCIDR")
    inner = other if isinstance(other, CIDR) else _cidr(_string(other, "containsCIDR"))
    return ct.BoolType(outer.bits <= inner.bits and outer.contains(inner.addr))


FUNCTIONS: Mapping[str, Callable[..., Any]] = returning_errors(
    {
        "ip": _ip,
        "isIP": _is_ip,
        "ip.isCanonical": _is_canonical,
        "family": _family,
        "isUnspecified": _predicate(_unspecified, "isUnspecified"),
        "isLoopback": _predicate(_loopback, "isLoopback"),
        "isLinkLocalMulticast": _predicate(_link_local_multicast, "isLinkLocalMulticast"),
        "isLinkLocalUnicast": _predicate(_link_local_unicast, "isLinkLocalUnicast"),
        "isGlobalUnicast": _predicate(_global_unicast, "isGlobalUnicast"),
        "cidr": _cidr,
        "isCIDR": _is_cidr,
        "containsIP": _contains_ip,
        "containsCIDR": _contains_cidr,
        "prefixLength": lambda p: ct.IntType(_prefix(p, "prefixLength").bits),
        "masked": lambda p: _prefix(p, "masked").masked(),
    }
)
