"""Protobuf at the wire level: ``status.devices`` replaced, every other byte kept."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from driver.kube import wire

SPACED = b'{"apiVersion": "gpu.tranche.dev/v1alpha1", "kind": "GpuConfig"}'


def claim(devices: list[bytes]) -> bytes:
    meta = wire.field_string(wire.META_NAME, "c") + wire.field_string(wire.META_NAMESPACE, "ns")
    meta += wire.field_string(wire.META_UID, "uid-1")
    meta += wire.field_string(wire.META_RESOURCE_VERSION, "42")
    # status.allocation: a nested message holding the opaque config's bytes as sent
    allocation = wire.field_bytes(1, wire.field_bytes(9, SPACED))
    status = wire.field_bytes(1, allocation) + wire.field_bytes(2, b"\x0a\x03pod")
    status += b"".join(wire.field_bytes(wire.STATUS_DEVICES, d) for d in devices)
    return (
        wire.field_bytes(wire.CLAIM_METADATA, meta)
        + wire.field_bytes(2, b"\x0a\x00")
        + wire.field_bytes(wire.CLAIM_STATUS, status)
    )


def entry(driver: str, device: str, data: bytes | None = None) -> bytes:
    ready = wire.Condition("Ready", "True", "Prepared", "ok", datetime(2026, 1, 1, tzinfo=UTC))
    return wire.device_status((driver, "node-a", device, ""), [ready], data)


def test_devices_are_replaced_and_the_allocation_bytes_kept() -> None:
    old_mine, theirs = entry("gpu.tranche.dev", "gpu-0"), entry("nic.example.com", "nic-0")
    envelope = (
        wire.MAGIC
        + wire.field_bytes(1, b"\x0a\x02v1")
        + wire.field_bytes(wire.UNKNOWN_RAW, claim([old_mine, theirs]))
    )
    outer, raw = wire.unwrap(envelope)
    assert wire.claim_meta(wire.fields(raw)) == wire.ClaimMeta("c", "ns", "uid-1", "42")
    new = entry("gpu.tranche.dev", "gpu-0", b'{"uuid":"GPU-1"}')
    updated = wire.wrap(
        outer,
        wire.with_status_devices(raw, [new], keep=lambda key: key[0] != "gpu.tranche.dev"),
    )
    assert updated.startswith(wire.MAGIC + wire.field_bytes(1, b"\x0a\x02v1"))
    _, raw2 = wire.unwrap(updated)
    status = wire.fields(wire.first(wire.fields(raw2), wire.CLAIM_STATUS) or b"")
    assert SPACED in (wire.first(status, 1) or b"")  # the allocation, byte for byte
    devices = [f.value for f in status if f.number == wire.STATUS_DEVICES]
    assert devices == [theirs, new]
    assert wire.device_key(new) == ("gpu.tranche.dev", "node-a", "gpu-0", "")


def test_a_claim_without_status_gets_one() -> None:
    raw = wire.field_bytes(wire.CLAIM_METADATA, wire.field_string(wire.META_UID, "u"))
    out = wire.with_status_devices(raw, [entry("d", "x")], keep=lambda _key: True)
    status = wire.fields(wire.first(wire.fields(out), wire.CLAIM_STATUS) or b"")
    assert [f.number for f in status] == [wire.STATUS_DEVICES]


@pytest.mark.parametrize(
    "body",
    [b"{}", wire.MAGIC + b"\x12\x05ab", wire.MAGIC + b"\x0f", wire.MAGIC + b"\x0a\x00"],
)
def test_what_is_not_a_protobuf_object_is_a_wire_error(body: bytes) -> None:
    with pytest.raises(wire.WireError):
        wire.unwrap(body)
