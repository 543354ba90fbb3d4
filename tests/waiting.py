"""Polling for a condition in tests, for unit and e2e tests alike."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest


def wait_for(
    what: str, check: Callable[[], Any], timeout_s: float = 60.0, interval_s: float = 0.25
) -> Any:
    """Call ``check`` until it returns something truthy and return that; fail the test,
    naming ``what``, after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s:.0f}s waiting for {what}")
        time.sleep(interval_s)
