"""One unary gRPC call over a Unix socket, spoken as plain HTTP/2 frames.

The health endpoint calls the plugin's own sockets as the kubelet does. gRPC's Python client
would do that too, but using it at all faults in its client half of ``libgrpc`` and keeps
its channel state, about 1 MiB of a plugin that must idle under 60 MiB
(``docs/performance.md``, ninth round). A call with a tiny request and answer needs little of
HTTP/2: the preface, a HEADERS frame whose header block uses only HPACK literals (RFC 7541
6.2.2, no Huffman code, no table), one DATA frame, and reading frames until the stream ends.

What the answer is: a unary call that succeeds always sends its message in DATA frames
before the trailers; a failed one sends its status without a message. Reading the status
itself would need an HPACK decoder (Huffman code, dynamic table), so a failure is reported
as a call answered without a message; the plugin's own log says why.
"""

from __future__ import annotations

import socket
import struct
import time
from typing import TypeVar

from google.protobuf.message import DecodeError, Message

M = TypeVar("M", bound=Message)

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

# Frame types and flags (RFC 9113 6).
DATA, HEADERS, RST_STREAM, SETTINGS, PING, GOAWAY = 0x0, 0x1, 0x3, 0x4, 0x6, 0x7
END_STREAM, ACK, END_HEADERS, PADDED = 0x1, 0x1, 0x4, 0x8
STREAM = 1  # the one stream a probe opens
MAX_FRAME = 1 << 14  # the smallest maximum a peer must accept; a probe sends far less


class ProbeError(Exception):
    """The call did not get its answer; the message says what happened instead."""


class ProbeTimeout(ProbeError):
    """The call got no answer in time: the server may be busy rather than gone."""


def call(path: str, method: str, request: Message, response: type[M], timeout: float) -> M:
    """Call ``method`` (``/package.Service/Method``) on the Unix socket ``path`` and return
    its answer, parsed as ``response``. Raises ProbeError for anything but an answer."""
    deadline = time.monotonic() + timeout
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        try:
            sock.settimeout(timeout)
            sock.connect(path)
            sock.sendall(_request_frames(method, request.SerializeToString()))
            body = _read_answer(sock, deadline)
        except ProbeError as e:
            raise ProbeError(f"{method} on {path}: {e}") from None
        except TimeoutError:
            raise ProbeTimeout(f"{method} on {path}: no answer within {timeout:g} s") from None
        except OSError as e:
            raise ProbeError(f"{method} on {path}: {e.strerror or e}") from None
    if body is None:
        raise ProbeError(f"{method} on {path}: the call ended without an answer (a gRPC error)")
    if len(body) < 5 or body[0] != 0 or int.from_bytes(body[1:5], "big") != len(body) - 5:
        raise ProbeError(f"{method} on {path}: the answer is not one uncompressed gRPC message")
    answer = response()
    try:
        answer.ParseFromString(body[5:])
    except DecodeError as e:
        raise ProbeError(
            f"{method} on {path}: the answer is not a {response.__name__}: {e}"
        ) from None
    return answer


def _request_frames(
    method: str, message: bytes, metadata: tuple[tuple[bytes, bytes], ...] = ()
) -> bytes:
    fields = (
        (b":method", b"POST"),
        (b":scheme", b"http"),
        (b":path", method.encode()),
        (b":authority", b"localhost"),
        (b"content-type", b"application/grpc"),
        (b"te", b"trailers"),
        *metadata,
    )
    headers = b"".join(_literal(name, value) for name, value in fields)
    data = b"\x00" + len(message).to_bytes(4, "big") + message
    if len(headers) > MAX_FRAME or len(data) > MAX_FRAME:
        raise ValueError(f"{method}: a probe's request must fit one frame")
    return (
        PREFACE
        + _frame(SETTINGS, 0, 0, b"")
        + _frame(HEADERS, END_HEADERS, STREAM, headers)
        + _frame(DATA, END_STREAM, STREAM, data)
    )


def _literal(name: bytes, value: bytes) -> bytes:
    """A header field as an HPACK literal without indexing, new name, no Huffman code."""
    return b"\x00" + _integer(len(name)) + name + _integer(len(value)) + value


def _integer(n: int) -> bytes:
    """An HPACK integer with a 7-bit prefix (RFC 7541 5.1), the string length's encoding."""
    if n < 127:
        return bytes([n])
    out = bytearray([127])
    n -= 127
    while n >= 128:
        out.append(n % 128 + 128)
        n //= 128
    out.append(n)
    return bytes(out)


def _frame(kind: int, flags: int, stream: int, payload: bytes) -> bytes:
    return struct.pack(">I", len(payload))[1:] + struct.pack(">BBI", kind, flags, stream) + payload


def _read_answer(sock: socket.socket, deadline: float) -> bytes | None:
    """The DATA of stream 1 once the stream has ended; None if it ended without any."""
    body = bytearray()
    while True:
        header = _read(sock, 9, deadline)
        length = int.from_bytes(header[:3], "big")
        kind, flags = header[3], header[4]
        stream = int.from_bytes(header[5:9], "big") & 0x7FFFFFFF
        payload = _read(sock, length, deadline)
        if kind == SETTINGS and not flags & ACK:
            sock.sendall(_frame(SETTINGS, ACK, 0, b""))
        elif kind == PING and not flags & ACK:
            sock.sendall(_frame(PING, ACK, 0, payload))
        elif kind == GOAWAY:
            raise ProbeError(
                f"the server closed the connection (GOAWAY, error {_code(payload, 4)})"
            )
        elif kind == RST_STREAM and stream == STREAM:
            raise ProbeError(f"the server reset the call (RST_STREAM, error {_code(payload, 0)})")
        elif kind == DATA and stream == STREAM:
            pad = payload[0] if flags & PADDED else 0
            body += payload[1 : len(payload) - pad] if flags & PADDED else payload
        if kind in (DATA, HEADERS) and stream == STREAM and flags & END_STREAM:
            return bytes(body) if body else None


def _code(payload: bytes, offset: int) -> int:
    return int.from_bytes(payload[offset : offset + 4], "big")


def _read(sock: socket.socket, n: int, deadline: float) -> bytes:
    out = bytearray()
    while len(out) < n:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError
        sock.settimeout(left)
        chunk = sock.recv(n - len(out))
        if not chunk:
            raise ProbeError("the server closed the connection before the call ended")
        out += chunk
    return bytes(out)
