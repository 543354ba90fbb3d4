"""How fast the machine is while a scenario runs: a fixed piece of Python work, timed.

The development machines are shared virtual machines whose speed changes by a factor of two
from one hour to the next (docs/performance.md). A scenario's timings say something about
the code only next to a measure of the machine taken at the same minutes. The work here is
what the plugin's hot path is made of (JSON encoded with sorted keys and decoded, a SHA-256
over it), on one thread, with no I/O, so that it moves with the CPU time the hypervisor
gives this machine and not with the disk or the API server.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable

from hack.bench.results import Row, median, timing

METRIC = "Machine speed: fixed Python work (calibration, lower is faster)"
ROUNDS = 7
# How often ``wait_until_quiet`` reads the machine, and how long it waits before confirming a
# quiet reading (one reading can fall between two other machines' bursts).
POLL_S = 120.0
CONFIRM_S = 20.0
_DOCUMENTS = 400

# About the size and shape of a whole-GPU claim record (2 KiB as JSON).
_DOCUMENT = {
    "uid": "6a1f0c52-6a3f-4f0e-9a55-0b6b3e9c2a11",
    "namespace": "team-a",
    "name": "train",
    "state": "PrepareCompleted",
    "devices": [
        {
            "requestNames": ["gpu"],
            "poolName": "node-a",
            "deviceName": f"gpu-{i}",
            "cdiDeviceIds": [f"gpu.tranche.dev/claim=6a1f0c52-gpu-{i}"],
            "shareId": None,
        }
        for i in range(4)
    ],
    "deviceUuids": {f"gpu-{i}": f"GPU-{i:08x}-1111-2222-3333-444455556666" for i in range(4)},
    "allocation": {
        "pods": [{"name": "trainer-0", "uid": "0d5f1c52-6a3f-4f0e-9a55-0b6b3e9c2a11"}],
        "preparedAt": 1767000000.2,
        "unpreparedAt": None,
    },
    "tenant": "team-a",
    "trustLevel": "shared",
}


def _round() -> float:
    started = time.perf_counter()
    for _ in range(_DOCUMENTS):
        text = json.dumps(_DOCUMENT, sort_keys=True)
        hashlib.sha256(text.encode()).hexdigest()
        json.loads(text)
    return time.perf_counter() - started


def measure(rounds: int = ROUNDS) -> list[float]:
    """Seconds per round of the fixed work, ``rounds`` times (after one warm-up round)."""
    _round()
    return [_round() for _ in range(rounds)]


def row(seconds: list[float]) -> Row:
    """The calibration row a scenario's results carry (``regression`` reads it)."""
    return timing(METRIC, seconds)


def wait_until_quiet(
    below_s: float,
    limit_s: float,
    *,
    read: Callable[[], float] = lambda: median(measure()),
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
    say: Callable[[str], None] = lambda line: print(line, flush=True),
) -> float | None:
    """Wait until two readings ``CONFIRM_S`` apart are both at most ``below_s`` seconds per
    round; return the second, or None when ``limit_s`` passed first. Every reading is said."""
    deadline = clock() + limit_s
    while True:
        reading = read()
        wanted = f"at most {below_s * 1e3:.2f}"
        say(f"machine speed: {reading * 1e3:.2f} ms per calibration round ({wanted})")
        if reading <= below_s and clock() + CONFIRM_S <= deadline:
            sleep(CONFIRM_S)
            again = read()
            say(f"machine speed again: {again * 1e3:.2f} ms")
            if again <= below_s:
                return again
        if clock() + POLL_S > deadline:
            return None
        sleep(POLL_S)
