"""The machine's real-node lock: one user at a time, a waiter told who holds it."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from hack.devcluster.errors import ClusterError
from hack.devcluster.realnode.machine_lock import machine_lock

HOLD = """
import sys, time
from pathlib import Path
from hack.devcluster.realnode.machine_lock import machine_lock
with machine_lock(5, path=Path(sys.argv[1])):
    print("held", flush=True)
    sys.stdin.readline()
"""


def _hold_in_another_process(path: Path) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parents[4],
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    return proc


def _release(proc: subprocess.Popen[str]) -> None:
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write("\n")
    proc.stdin.close()
    proc.wait(10)
    proc.stdout.close()


def test_a_second_user_fails_after_its_wait_naming_the_holder(tmp_path: Path) -> None:
    path = tmp_path / "real-nodes.lock"
    holder = _hold_in_another_process(path)
    try:
        told: list[str] = []
        with pytest.raises(ClusterError) as e, machine_lock(1.0, path=path, on_wait=told.append):
            pass
        assert f"pid {holder.pid}" in str(e.value)
        assert str(path) in str(e.value)
        assert len(told) == 1 and f"pid {holder.pid}" in told[0]
    finally:
        _release(holder)


def test_a_waiting_user_gets_the_lock_when_the_holder_is_done(tmp_path: Path) -> None:
    path = tmp_path / "real-nodes.lock"
    holder = _hold_in_another_process(path)
    got = threading.Event()

    def second() -> None:
        with machine_lock(30, path=path):
            assert path.read_text().startswith(f"pid {os.getpid()} ")
            got.set()

    waiter = threading.Thread(target=second)
    waiter.start()
    time.sleep(1.0)
    assert not got.is_set()  # still held by the other process
    _release(holder)
    waiter.join(30)
    assert got.is_set()
    assert path.read_text() == ""  # released: the holder's line is cleared
