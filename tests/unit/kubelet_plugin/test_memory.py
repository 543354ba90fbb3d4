"""Freed heap pages go back to the system: the plugin's RSS follows what it holds, not
its high-water mark (start-up's slice building, a burst of prepares)."""

from __future__ import annotations

import subprocess
import sys

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
