"""Log set-up: the background writer keeps the callers off the stream, and loses nothing
that was queued before it is written out."""

from __future__ import annotations

import io
import json
import logging
import threading
import time
from collections.abc import Iterator

import pytest

from driver.logs import configure

log = logging.getLogger("tranche.test")


class _GatedStream(io.StringIO):
    """stderr whose writes wait until the gate opens (a slow or full pipe)."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()

    def write(self, text: str) -> int:
        self.gate.wait(30)
        return super().write(text)


@pytest.fixture
def stream() -> Iterator[_GatedStream]:
    root = logging.getLogger()
    saved = (root.handlers[:], root.level)
    gated = _GatedStream()
    yield gated
    gated.gate.set()
    root.handlers[:], root.level = saved


def _lines(stream: io.StringIO) -> list[dict[str, object]]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def test_a_caller_does_not_wait_for_the_stream(stream: _GatedStream) -> None:
    write_out = configure("json", "INFO", background=True, stream=stream)
    logged = threading.Thread(target=lambda: log.info("prepare done claim_uid=%s", "u1"))
    logged.start()
    logged.join(10)
    assert not logged.is_alive()  # returned while stderr still blocks
    assert stream.getvalue() == ""
    stream.gate.set()
    write_out()
    assert [line["msg"] for line in _lines(stream)] == ["prepare done claim_uid=u1"]


def test_writing_out_keeps_every_record_in_order_then_logs_directly(
    stream: _GatedStream,
) -> None:
    stream.gate.set()
    write_out = configure("json", "INFO", background=True, stream=stream)
    for i in range(500):
        log.info("record %d", i)
    write_out()
    assert [line["msg"] for line in _lines(stream)] == [f"record {i}" for i in range(500)]
    log.info("after")  # written by the caller now
    assert _lines(stream)[-1]["msg"] == "after"
    write_out()  # a second call is harmless


def test_a_record_keeps_its_arguments_as_logged_and_its_exception_as_a_field(
    stream: _GatedStream,
) -> None:
    write_out = configure("json", "INFO", background=True, stream=stream)
    devices = ["gpu-0"]
    log.info("devices=%s", devices)
    devices.append("gpu-1")  # changed before the writer formats the line
    try:
        raise ValueError("corrupt checkpoint")
    except ValueError:
        log.exception("recovery failed claim_uid=%s", "u2")
    stream.gate.set()
    write_out()
    first, second = _lines(stream)
    assert first["msg"] == "devices=['gpu-0']"
    assert second["msg"] == "recovery failed claim_uid=u2"  # not the traceback
    assert "ValueError: corrupt checkpoint" in str(second["error"])
    assert second["level"] == "error"


def test_a_stalled_stream_holds_at_most_the_queue_limit_and_the_drop_is_written_later(
    stream: _GatedStream,
) -> None:
    write_out = configure("json", "INFO", background=True, stream=stream, queue_limit=50)
    for i in range(500):  # stderr stalled: the queue must not grow with what is logged
        log.info("record %d", i)
    dropped = write_out.dropped()  # what the metric reads while stderr is still stalled
    assert 500 - 51 <= dropped <= 500 - 50
    stream.gate.set()
    write_out()
    lines = _lines(stream)
    records = [line["msg"] for line in lines if line["msg"] != "log records dropped"]
    notices = [line for line in lines if line["msg"] == "log records dropped"]
    assert 50 <= len(records) <= 51  # the limit, and the one the writer held when it stalled
    assert records == sorted(records, key=lambda m: int(str(m).split()[1]))  # in order
    # One warning per gap (two when the writer took its first record after drops began),
    # and every record either written or counted.
    assert 1 <= len(notices) <= 2
    assert {str(n["level"]) for n in notices} == {"warning"}
    assert sum(int(str(n["dropped"])) for n in notices) == 500 - len(records) == dropped
    assert lines[-1]["msg"] == "log records dropped"  # the last gap, after what was kept


class _CountingStream(io.StringIO):
    def __init__(self) -> None:
        super().__init__()
        self.writes = 0

    def write(self, text: str) -> int:
        self.writes += 1
        return super().write(text)


def _wait_for_lines(stream: io.StringIO, count: int) -> list[dict[str, object]]:
    deadline = time.monotonic() + 10
    while len(lines := _lines(stream)) < count and time.monotonic() < deadline:
        time.sleep(0.01)
    return lines


def test_a_burst_of_records_is_written_in_a_few_pieces_without_being_asked(
    stream: _GatedStream,
) -> None:
    counting = _CountingStream()
    # A 1 s gathering window, not the default 50 ms: a loaded machine may pause the burst.
    write_out = configure("json", "INFO", background=True, stream=counting, batch_s=1.0)
    for i in range(200):  # a burst of prepares, each logging a line
        log.info("prepare done claim_uid=u%d", i)
    lines = _wait_for_lines(counting, 200)  # written by the writer thread on its own
    assert [line["msg"] for line in lines] == [f"prepare done claim_uid=u{i}" for i in range(200)]
    # Gathered for the window after the first record woke the writer: one write, a few
    # more if this machine paused the burst; a line at a time was 200 writes.
    assert counting.writes <= 5
    write_out()
