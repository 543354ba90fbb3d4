"""The image runs both processes optimised (``PYTHONOPTIMIZE=2``: no docstrings, no asserts;
``PYTHONNODEBUGRANGES``), which saves the plugin about 2.3 MiB at idle (docs/performance.md).
Every module must import that way, and the commands must still work and explain themselves:
a module that reads or extends a docstring, or an option whose help came from one, would
break only in the image."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("driver", "kubelet_plugin", "controller", "proto")
IMAGE_FLAGS = {"PYTHONOPTIMIZE": "2", "PYTHONNODEBUGRANGES": "1"}

IMPORT_ALL = """
import importlib, pkgutil, sys
names = []
for package in sys.argv[1:]:
    names.append(package)
    for info in pkgutil.walk_packages(importlib.import_module(package).__path__, package + "."):
        if info.name.rpartition(".")[2] != "__main__":  # runs a command
            names.append(info.name)
failed = []
for name in names:
    try:
        importlib.import_module(name)
    except Exception as e:  # report them all, not the first
        failed.append(f"{name}: {type(e).__name__}: {e}")
print(sys.flags.optimize, len(names))
print("\\n".join(failed))
"""


def _optimised(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args],
        capture_output=True,
        text=True,
        check=False,
        cwd=REPO,
        env={**os.environ, **IMAGE_FLAGS},
        timeout=120,
    )


def test_every_module_imports_without_docstrings_and_asserts() -> None:
    run = _optimised("-c", IMPORT_ALL, *PACKAGES)
    assert run.returncode == 0, run.stderr
    head, *failed = run.stdout.splitlines()
    optimize, count = head.split()
    assert optimize == "2"
    assert int(count) > 150, "walked too few modules to mean anything"
    assert [f for f in failed if f] == []


def test_the_plugin_validates_its_settings_when_optimised() -> None:
    run = _optimised("-m", "driver.cli", "kubelet-plugin", "--node-name", "n", "--dry-run")
    assert run.returncode == 0, run.stderr
    assert '"node_name": "n"' in run.stdout


HELP = """
import contextlib, io, sys
from driver.cli import main
for name in sys.argv[1:]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
        main([name, "--help"] if name else ["--help"])
    print(repr(out.getvalue()))
"""


def test_every_command_still_explains_itself_when_optimised() -> None:
    commands = ("kubelet-plugin", "controller", "devices", "taint", "explain", "report")
    run = _optimised("-c", HELP, "", *commands)
    assert run.returncode == 0, run.stderr
    top, *each = (ast.literal_eval(line) for line in run.stdout.splitlines())
    for name, text in zip(commands, each, strict=True):
        assert name in top
        usage, _, rest = text.partition("\n\n")
        assert usage.startswith(f"usage: tranche {name}"), name
        assert rest.strip().splitlines()[0].strip(), f"{name}: no description"
