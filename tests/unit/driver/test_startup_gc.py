"""The garbage collector around a process's start (driver/startup_gc.py, driver.cli)."""

from __future__ import annotations

import gc
import json
import subprocess
import sys
import weakref
from collections.abc import Iterator

import pytest

from driver import startup_gc

# Loads the kubelet plugin's command as the `tranche` executable does, and reports what the
# collector did meanwhile and what it holds after.
LOAD = """
import gc, json, sys
from driver.cli import main
before = sum(s["collections"] for s in gc.get_stats())
try:
    main(["kubelet-plugin", "--help"], process_start=sys.argv[1] == "process")
except SystemExit:
    pass
print(json.dumps({
    "collections": sum(s["collections"] for s in gc.get_stats()) - before,
    "enabled": gc.isenabled(),
    "frozen": gc.get_freeze_count(),
}))
"""


def _load(mode: str) -> dict[str, int]:
    run = subprocess.run(
        [sys.executable, "-c", LOAD, mode], capture_output=True, text=True, check=False
    )
    assert run.returncode == 0, run.stderr
    seen: dict[str, int] = json.loads(run.stdout.strip().splitlines()[-1])
    return seen


def test_the_executable_loads_its_command_without_collecting_and_freezes_what_it_loaded() -> None:
    as_library = _load("library")
    assert as_library["collections"] > 10, "the imports no longer trigger collections"
    assert as_library["frozen"] == 0

    as_process = _load("process")
    assert as_process["collections"] == 0
    assert as_process["enabled"]
    # The plugin's imports are about 90,000 objects; later collections skip them.
    assert as_process["frozen"] > 20_000


class _Cycle:
    def __init__(self) -> None:
        self.me = self


@pytest.fixture
def collector() -> Iterator[None]:
    """The test process's collector as it was: unfrozen and enabled."""
    yield
    gc.unfreeze()
    gc.enable()


def test_start_up_garbage_frozen_with_the_imports_is_collected_once_started(
    collector: None,
) -> None:
    startup_gc.pause()
    garbage = _Cycle()
    gone = weakref.ref(garbage)
    del garbage
    startup_gc.resume()
    assert gc.isenabled()
    gc.collect()
    assert gone() is not None, "frozen garbage is not collected by ordinary collections"

    assert startup_gc.collect_startup_garbage() >= 1
    assert gone() is None
    assert gc.get_freeze_count() > 0, "what survives is frozen again"
