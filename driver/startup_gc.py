"""Python's cyclic garbage collector around a process's start.

Importing a command's modules allocates about 90,000 objects (classes, functions, schemas)
that live as long as the process. While they are young the collector scans them again and
again, and every full collection afterwards walks all of them: 15-40 ms each on the
development machines, on whatever thread triggered it (a prepare, the first publish).

So the ``tranche`` executable (:func:`driver.cli.process_main`) pauses the collector while
it loads the command (:func:`pause`), then freezes what the imports left (:func:`resume`:
``gc.freeze`` moves every tracked object out of the collector's generations, so later
collections skip them).
Imports also leave some cyclic garbage (about 180 KiB for the kubelet plugin's), which the
freeze would keep for good: a long-running command calls :func:`collect_startup_garbage`
once it has started and is quiet, which collects it and freezes what is left.
"""

from __future__ import annotations

import gc


def pause() -> None:
    """No collection until :func:`resume`."""
    gc.disable()


def resume() -> None:
    """Freeze every object allocated so far, then collect again as usual."""
    gc.freeze()
    gc.enable()


def collect_startup_garbage() -> int:
    """Collect the cycles that start-up left, frozen or not, then freeze what survives, so
    that later collections walk only what the process allocates from now on. Costs one full
    collection (10-40 ms): call it when the process is quiet. The number collected."""
    gc.unfreeze()
    found = gc.collect()
    gc.freeze()
    return found
