"""What a selector sees of one device: :class:`DeviceData` and the ``device`` variable built
from it (:func:`activation`), with the scheduler's typing of attributes and capacities."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import celpy.celtypes as ct

from controller.explain.cel.library import _quantity
from controller.explain.cel.values import CelEvalError, Semver


class _Domains(ct.MapType):
    """``device.attributes`` / ``device.capacity``: an unknown domain is an empty map."""

    def __getitem__(self, key: Any) -> Any:
        try:
            return super().__getitem__(key)
        except KeyError:
            return ct.MapType({})


@dataclass(frozen=True)
class DeviceData:
    """What a selector sees of one device: the API's ``attributes`` and ``capacity`` maps."""

    driver: str
    attributes: Mapping[str, Any]
    capacity: Mapping[str, Any]
    allow_multiple_allocations: bool = False


def _attribute_value(raw: Any) -> Any:
    if not isinstance(raw, Mapping):
        return ct.StringType(str(raw))
    if "string" in raw:
        return ct.StringType(raw["string"])
    if "bool" in raw:
        return ct.BoolType(bool(raw["bool"]))
    if "int" in raw:
        return ct.IntType(int(raw["int"]))
    if "version" in raw:
        try:
            return Semver(str(raw["version"]))
        except CelEvalError:
            return ct.StringType(str(raw["version"]))
    for key in ("strings", "ints", "bools", "versions"):
        if key in raw:
            return ct.ListType([_attribute_value({key[:-1]: v}) for v in raw[key]])
    return ct.StringType("")


def _split_name(name: str, driver: str) -> tuple[str, str]:
    if "/" in name:
        domain, _, ident = name.rpartition("/")
        return domain, ident
    return driver, name


def activation(device: DeviceData) -> dict[str, Any]:
    attrs: dict[str, dict[Any, Any]] = {}
    for name, raw in device.attributes.items():
        domain, ident = _split_name(name, device.driver)
        attrs.setdefault(domain, {})[ct.StringType(ident)] = _attribute_value(raw)
    caps: dict[str, dict[Any, Any]] = {}
    for name, raw in device.capacity.items():
        domain, ident = _split_name(name, device.driver)
        value = raw.get("value", "0") if isinstance(raw, Mapping) else raw
        caps.setdefault(domain, {})[ct.StringType(ident)] = _quantity(value)
    return {
        "device": ct.MapType(
            {
                ct.StringType("driver"): ct.StringType(device.driver),
                ct.StringType("attributes"): _Domains(
                    {ct.StringType(d): ct.MapType(v) for d, v in attrs.items()}
                ),
                ct.StringType("capacity"): _Domains(
                    {ct.StringType(d): ct.MapType(v) for d, v in caps.items()}
                ),
                ct.StringType("allowMultipleAllocations"): ct.BoolType(
                    device.allow_multiple_allocations
                ),
            }
        )
    }
