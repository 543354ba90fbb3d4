"""Giving freed heap memory back to the system, and holding less of it.

Building and publishing the ResourceSlices at start (about 5 MiB of short-lived dicts
for a 208-device node) and a burst of prepares leave glibc's heap holding freed pages:
the process's RSS stays at its high-water mark although Python freed the objects.
``malloc_trim(0)`` returns them. The plugin calls it once its first publish is done and
after each usage sample (every ``--sample-interval``); it costs about a millisecond.

glibc also gives each new thread a heap (an arena) of its own, up to eight per core, and
each keeps the pages it freed: after a burst of prepares on the gRPC and claim-read threads
the plugin held 5.3-5.4 MiB more than idle, 4.7-4.9 MiB with two arenas (three runs each).
Python allocates small objects under the GIL from its own pools, so the threads hardly
contend for ``malloc``. :func:`limit_arenas` sets two, at start, unless the operator chose
with ``MALLOC_ARENA_MAX``.
"""

from __future__ import annotations

import ctypes
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from driver.startup_gc import collect_startup_garbage

log = logging.getLogger(__name__)

M_ARENA_MAX = -8  # mallopt parameter (malloc.h)
ARENAS = 2


def _libc_function(name: str) -> Any:
    """``name`` from the C library the interpreter runs on (no search of the library path,
    which costs 1.4 ms per lookup); None where it has no such function."""
    try:
        return getattr(ctypes.CDLL(None), name)
    except (OSError, AttributeError):  # not glibc (musl has no malloc_trim)
        return None


def _malloc_trim() -> Callable[[int], int] | None:
    trim = _libc_function("malloc_trim")
    if trim is None:
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    found: Callable[[int], int] = trim
    return found


_TRIM = _malloc_trim()


def limit_arenas(environ: Mapping[str, str] = os.environ, arenas: int = ARENAS) -> bool:
    """At most ``arenas`` malloc heaps for the threads started from now on; False where the
    C library cannot, or ``MALLOC_ARENA_MAX`` already says how many (glibc read it at start).
    Call it before starting threads."""
    if "MALLOC_ARENA_MAX" in environ:
        return False
    mallopt = _libc_function("mallopt")
    if mallopt is None:
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return bool(mallopt(M_ARENA_MAX, arenas))


def release_freed_memory() -> bool:
    """Return the heap's free pages to the system; False where the C library cannot."""
    if _TRIM is None:
        return False
    _TRIM(0)
    return True


def settle_after_start(
    published: Callable[[float], bool], stop: threading.Event, within_s: float
) -> bool:
    """Once the first publish is done (``published(timeout)`` says so), or ``within_s`` has
    passed without one (an API server that is down), collect the cyclic garbage that start-up
    left frozen (driver/startup_gc.py) and return the heap's free pages. False, doing
    neither, when ``stop`` is set first."""
    deadline = time.monotonic() + within_s
    while not stop.is_set() and time.monotonic() < deadline:
        if published(0.2):
            break
    if stop.is_set():
        return False
    collect_startup_garbage()
    release_freed_memory()
    return True
