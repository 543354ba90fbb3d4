"""Freed heap pages go back to the system: the plugin's RSS follows what it holds, not
its high-water mark (start-up's slice building, a burst of prepares). Its threads share two
malloc heaps unless the operator chose another number."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from kubelet_plugin.memory import limit_arenas

REPO = Path(__file__).resolve().parents[3]

CHECK = """
from kubelet_plugin.memory import release_freed_memory

def rss_mib():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS"):
            return int(line.split()[1]) / 1024

garbage = [bytes(1024) + bytes([i % 256]) for i in range(60_000)]  # about 60 MiB on the heap
kept = bytes(2048)  # allocated after it: the freed pages are not at the heap's top
del garbage
held = rss_mib()
assert release_freed_memory()
print(round(held - rss_mib()))
"""


def test_release_gives_freed_heap_pages_back() -> None:
    run = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True, check=False)
    assert run.returncode == 0, run.stderr
    assert int(run.stdout) >= 40  # MiB returned of the 60 freed


# Eight threads hold malloc'd buffers (above pymalloc's 512 bytes, below the mmap threshold)
# while glibc's malloc_info lists one <heap> per arena.
ARENAS = """
import ctypes, ctypes.util, sys, tempfile, threading
from kubelet_plugin.memory import limit_arenas
if sys.argv[1] == "limit":
    assert limit_arenas()
ready, done = threading.Barrier(9), threading.Event()
def work():
    held = [ctypes.create_string_buffer(16 * 1024) for _ in range(64)]
    ready.wait()
    done.wait()
threads = [threading.Thread(target=work) for _ in range(8)]
for t in threads:
    t.start()
ready.wait()
libc = ctypes.CDLL(ctypes.util.find_library("c"))
libc.fopen.restype = ctypes.c_void_p
path = tempfile.mktemp()
stream = ctypes.c_void_p(libc.fopen(path.encode(), b"w"))
libc.malloc_info(0, stream)
libc.fclose(stream)
done.set()
for t in threads:
    t.join()
print(open(path).read().count("<heap nr="))
"""


def _arenas(mode: str) -> int:
    environ = {k: v for k, v in os.environ.items() if k != "MALLOC_ARENA_MAX"}
    run = subprocess.run(
        [sys.executable, "-c", ARENAS, mode],
        cwd=REPO,
        env=environ,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    return int(run.stdout.split()[-1])


def test_the_plugins_threads_share_two_malloc_heaps() -> None:
    assert _arenas("glibc") > 2  # glibc's own choice: a heap per thread, up to 8 per core
    assert _arenas("limit") <= 2


def test_an_operators_malloc_arena_max_is_left_alone() -> None:
    assert limit_arenas({"MALLOC_ARENA_MAX": "4"}) is False


SETTLE = """
import gc, sys, threading, weakref
from driver import startup_gc
from kubelet_plugin.memory import settle_after_start

class Cycle:
    def __init__(self):
        self.me = self

startup_gc.pause()
garbage = Cycle()
gone = weakref.ref(garbage)
del garbage
startup_gc.resume()  # as the executable does: the garbage is frozen with the imports
stop = threading.Event()
if sys.argv[1] == "stopped":
    stop.set()
published = {"never": lambda timeout: False, "now": lambda timeout: True}.get(sys.argv[1])
settled = settle_after_start(published or (lambda timeout: False), stop, within_s=0.5)
print(settled, gone() is None)
"""


def _settle(case: str) -> str:
    run = subprocess.run(
        [sys.executable, "-c", SETTLE, case], capture_output=True, text=True, check=False
    )
    assert run.returncode == 0, run.stderr
    return run.stdout.strip()


def test_start_up_garbage_is_collected_once_published_or_when_the_first_sample_is_due() -> None:
    """A plugin whose API server is down at start still lets go of what its imports left:
    the collection waits for the first publish only until the first sample is due."""
    assert _settle("now") == "True True"
    assert _settle("never") == "True True"
    assert _settle("stopped") == "False False"
