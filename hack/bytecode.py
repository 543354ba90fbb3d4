"""The project's modules compiled to ``__pycache__`` (``make bytecode``, and the benchmarks
before they start processes), as the image ships them compiled.

These machines set ``PYTHONDONTWRITEBYTECODE`` and the checkout is an editable install, so
without this every process the tests, the demo and the benchmarks start would compile the
project's modules again: about 0.1-0.2 s that an installed plugin does not spend. Files
that are up to date are left alone.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("driver", "kubelet_plugin", "controller", "proto", "hack", "tests")


def compile_bytecode() -> None:
    subprocess.run(
        [sys.executable, "-m", "compileall", "-q", "-j", "0", *PACKAGES],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        check=True,
    )


if __name__ == "__main__":
    compile_bytecode()
