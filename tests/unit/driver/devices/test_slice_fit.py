"""Fitting one GPU's devices into a Kubernetes 1.34 slice: whole groups, sorted, base kept."""

from __future__ import annotations

from typing import Any

import pytest

from driver.devices.slice_fit import fit_devices


def _device(name: str, counters: int, group: str | None = None) -> dict[str, Any]:
    consumed = {f"c{i}": {"value": "1"} for i in range(counters)}
    device: dict[str, Any] = {"name": name, "consumesCounters": [{"counters": consumed}]}
    if group:
        device["attributes"] = {"sharingGroup": {"string": group}}
    return device


BASE = [_device("gpu", 10), _device("mig-0", 5)]
SHARES = [_device(f"{m}-{g}", 10, g) for m in ("ts", "mps") for g in ("c", "a", "b")]
EXTRAS = {d["name"] for d in SHARES}


@pytest.mark.parametrize(
    ("max_devices", "max_counters", "kept_groups", "left_out"),
    [
        (128, None, {"a", "b", "c"}, ()),
        (128, 55, {"a", "b"}, ("c",)),  # 15 + 2 x 20 = 55
        (128, 54, {"a"}, ("b", "c")),
        (128, 15, set(), ("a", "b", "c")),  # the whole GPU and MIG slot always stay
        (5, None, {"a"}, ("b", "c")),  # the device limit too
    ],
)
def test_whole_groups_in_sorted_order_are_kept_while_they_fit(
    max_devices: int, max_counters: int | None, kept_groups: set[str], left_out: tuple[str, ...]
) -> None:
    kept, out = fit_devices(
        [*BASE, *SHARES], EXTRAS, max_devices=max_devices, max_counters=max_counters
    )
    assert out == left_out
    names = [d["name"] for d in kept]
    assert names[:2] == ["gpu", "mig-0"]
    expected = [
        d["name"] for d in SHARES if d["attributes"]["sharingGroup"]["string"] in kept_groups
    ]
    assert names[2:] == expected  # the slice's order is kept
