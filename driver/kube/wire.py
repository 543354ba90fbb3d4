"""Kubernetes protobuf objects at the wire level: edit one field, keep every other byte.

The API server keeps a ResourceClaim's opaque config (a ``RawExtension``) as the bytes its
creator sent. Any JSON write re-encodes the claim (compact JSON), so for a claim created
with spaced JSON (the Python kubernetes client) the allocation's bytes change and the
server refuses the write ("status.allocation: field cannot be modified once set"), merge,
strategic, JSON and apply patches alike. In protobuf a ``RawExtension`` is a bytes field:
reading the claim as protobuf and writing it back with only ``status.devices`` changed
leaves the allocation byte for byte as it was, whatever client created the claim.

No generated code: a protobuf message is a sequence of ``(field number, wire type,
value)``; this module splits one into its fields (keeping each field's bytes), and
builds the few messages the plugin writes. The field numbers are those of
``k8s.io/api/resource/v1/generated.proto`` and ``k8s.io/apimachinery``'s meta/runtime
protos.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

MAGIC = b"k8s\x00"  # the envelope of every Kubernetes protobuf object
CONTENT_TYPE = "application/vnd.kubernetes.protobuf"

VARINT, I64, LEN, I32 = 0, 1, 2, 5

# runtime.Unknown (the envelope), meta/v1 and resource/v1 field numbers
UNKNOWN_RAW = 2
CLAIM_METADATA, CLAIM_STATUS = 1, 3
META_NAME, META_NAMESPACE, META_UID, META_RESOURCE_VERSION = 1, 3, 5, 6
STATUS_DEVICES = 4
DEVICE_DRIVER, DEVICE_POOL, DEVICE_NAME, DEVICE_CONDITIONS, DEVICE_DATA, DEVICE_SHARE_ID = (
    1,
    2,
    3,
    4,
    5,
    7,
)
CONDITION_TYPE, CONDITION_STATUS, CONDITION_TIME, CONDITION_REASON, CONDITION_MESSAGE = (
    1,
    2,
    4,
    5,
    6,
)
TIME_SECONDS = 1
RAW_EXTENSION_RAW = 1


class WireError(ValueError):
    """Bytes that are not the protobuf object expected."""


@dataclass(frozen=True)
class Field:
    """One field of a message: number, wire type, value (int, or bytes for LEN), and the
    field's own bytes (tag included), re-emitted unchanged when it is kept."""

    number: int
    wire_type: int
    value: int | bytes
    encoded: bytes


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(buf) or shift > 63:
            raise WireError("truncated or overlong varint")
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7


def fields(buf: bytes) -> list[Field]:
    """The fields of one message, in order."""
    out: list[Field] = []
    pos = 0
    while pos < len(buf):
        start = pos
        tag, pos = _varint(buf, pos)
        number, wire_type = tag >> 3, tag & 7
        value: int | bytes
        if wire_type == VARINT:
            value, pos = _varint(buf, pos)
        elif wire_type == LEN:
            size, pos = _varint(buf, pos)
            if pos + size > len(buf):
                raise WireError(f"field {number}: {size} bytes announced, {len(buf) - pos} left")
            value, pos = buf[pos : pos + size], pos + size
        elif wire_type in (I64, I32):
            width = 8 if wire_type == I64 else 4
            if pos + width > len(buf):
                raise WireError(f"field {number}: truncated fixed-width value")
            value, pos = int.from_bytes(buf[pos : pos + width], "little"), pos + width
        else:
            raise WireError(f"field {number}: unsupported wire type {wire_type}")
        if number == 0:
            raise WireError("field number 0")
        out.append(Field(number, wire_type, value, buf[start:pos]))
    return out


def _encode_varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def field_bytes(number: int, value: bytes) -> bytes:
    return _encode_varint(number << 3 | LEN) + _encode_varint(len(value)) + value


def field_varint(number: int, value: int) -> bytes:
    return _encode_varint(number << 3 | VARINT) + _encode_varint(value)


def field_string(number: int, value: str) -> bytes:
    return field_bytes(number, value.encode())


def first(message: Sequence[Field], number: int) -> bytes | None:
    """The bytes of the first LEN field ``number`` (a string or a nested message)."""
    for f in message:
        if f.number == number and isinstance(f.value, bytes):
            return f.value
    return None


def text(message: Sequence[Field], number: int) -> str:
    value = first(message, number)
    return value.decode(errors="replace") if value is not None else ""


# ---- the objects ----------------------------------------------------------------------


def unwrap(envelope: bytes) -> tuple[list[Field], bytes]:
    """The envelope's fields and the object's own bytes (``runtime.Unknown.raw``)."""
    if not envelope.startswith(MAGIC):
        raise WireError("not a Kubernetes protobuf object (no k8s\\0 prefix)")
    outer = fields(envelope[len(MAGIC) :])
    raw = first(outer, UNKNOWN_RAW)
    if raw is None:
        raise WireError("the envelope holds no object")
    return outer, raw


def wrap(outer: Sequence[Field], raw: bytes) -> bytes:
    """The envelope ``outer`` around new object bytes ``raw``."""
    body = b"".join(
        field_bytes(UNKNOWN_RAW, raw) if f.number == UNKNOWN_RAW else f.encoded for f in outer
    )
    return MAGIC + body


@dataclass(frozen=True)
class ClaimMeta:
    name: str
    namespace: str
    uid: str
    resource_version: str


def claim_meta(claim: Sequence[Field]) -> ClaimMeta:
    meta = fields(first(claim, CLAIM_METADATA) or b"")
    return ClaimMeta(
        text(meta, META_NAME),
        text(meta, META_NAMESPACE),
        text(meta, META_UID),
        text(meta, META_RESOURCE_VERSION),
    )


DeviceKey = tuple[str, str, str, str]  # driver, pool, device, shareID


def device_key(entry: bytes) -> DeviceKey:
    f = fields(entry)
    return (
        text(f, DEVICE_DRIVER),
        text(f, DEVICE_POOL),
        text(f, DEVICE_NAME),
        text(f, DEVICE_SHARE_ID),
    )


def with_status_devices(
    claim_raw: bytes, new: Sequence[bytes], keep: Callable[[DeviceKey], bool]
) -> bytes:
    """The claim ``claim_raw`` with ``status.devices`` = the entries ``keep`` keeps, then
    ``new``; every other byte of the claim (the allocation above all) as it was."""
    claim = fields(claim_raw)
    status_raw = first(claim, CLAIM_STATUS)
    status = fields(status_raw) if status_raw is not None else []
    body = b"".join(
        f.encoded
        for f in status
        if f.number != STATUS_DEVICES or (isinstance(f.value, bytes) and keep(device_key(f.value)))
    )
    body += b"".join(field_bytes(STATUS_DEVICES, entry) for entry in new)
    out = [
        field_bytes(CLAIM_STATUS, body) if f.number == CLAIM_STATUS else f.encoded for f in claim
    ]
    if status_raw is None:
        out.append(field_bytes(CLAIM_STATUS, body))
    return b"".join(out)


@dataclass(frozen=True)
class Condition:
    type: str
    status: str
    reason: str
    message: str
    last_transition: datetime


def _condition(c: Condition) -> bytes:
    seconds = int(c.last_transition.timestamp())
    return (
        field_string(CONDITION_TYPE, c.type)
        + field_string(CONDITION_STATUS, c.status)
        + field_bytes(CONDITION_TIME, field_varint(TIME_SECONDS, seconds))
        + field_string(CONDITION_REASON, c.reason)
        + field_string(CONDITION_MESSAGE, c.message)
    )


def device_status(
    key: DeviceKey, conditions: Iterable[Condition], data_json: bytes | None
) -> bytes:
    """An ``AllocatedDeviceStatus``; ``data_json``: the ``data`` field as JSON bytes."""
    driver, pool, device, share_id = key
    out = field_string(DEVICE_DRIVER, driver) + field_string(DEVICE_POOL, pool)
    out += field_string(DEVICE_NAME, device)
    out += b"".join(field_bytes(DEVICE_CONDITIONS, _condition(c)) for c in conditions)
    if data_json is not None:
        out += field_bytes(DEVICE_DATA, field_bytes(RAW_EXTENSION_RAW, data_json))
    if share_id:
        out += field_string(DEVICE_SHARE_ID, share_id)
    return out


def keys_of(entries: Iterable[Mapping[str, object]]) -> set[DeviceKey]:
    """The keys of ``status.devices`` entries given as JSON objects."""
    return {
        (
            str(e.get("driver") or ""),
            str(e.get("pool") or ""),
            str(e.get("device") or ""),
            str(e.get("shareID") or ""),
        )
        for e in entries
    }
