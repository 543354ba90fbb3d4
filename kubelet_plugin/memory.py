"""Giving freed heap memory back to the system.

Building and publishing the ResourceSlices at start (about 5 MiB of short-lived dicts
for a 208-device node) and a burst of prepares leave glibc's heap holding freed pages:
the process's RSS stays at its high-water mark although Python freed the objects.
``malloc_trim(0)`` returns them. The plugin calls it once its first publish is done and
after each usage sample (every ``--sample-interval``); it costs about a millisecond.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
from collections.abc import Callable

log = logging.getLogger(__name__)


def _malloc_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        trim = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):  # not glibc (musl has no malloc_trim)
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    found: Callable[[int], int] = trim
    return found


_TRIM = _malloc_trim()


def release_freed_memory() -> bool:
    """Return the heap's free pages to the system; False where the C library cannot."""
    if _TRIM is None:
        return False
    _TRIM(0)
    return True
