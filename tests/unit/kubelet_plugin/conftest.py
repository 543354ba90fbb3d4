"""Fixtures shared by the plugin's unit tests."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A short directory under /tmp: a socket path under pytest's ``tmp_path`` can pass the
    108-byte limit of a Unix socket's path."""
    path = Path(tempfile.mkdtemp(prefix="kl", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)
