"""The ``tranche`` command.

Subcommands are contributed by the packages that own them through the
``tranche.commands`` entry-point group (see ``pyproject.toml``). Each entry
point is a :class:`Command`: a name, a function that adds its arguments to an
:class:`argparse.ArgumentParser`, and a function that runs it. This keeps
``driver/`` free of imports of ``kubelet_plugin/`` and ``controller/``.

Public: :func:`main`, :class:`Command`, :func:`load_commands`. The driver's own
subcommands live beside it: :mod:`driver.cli.devices` (``tranche devices``) and
:mod:`driver.cli.sim` (``tranche sim``).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib.metadata import entry_points

from driver import startup_gc
from driver.errors import ConfigError


@dataclass(frozen=True)
class Command:
    """One ``tranche`` subcommand."""

    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


def load_commands(only: str | None = None) -> dict[str, Command]:
    """Every subcommand, or only the one named ``only`` when one has that name.

    Loading a command imports its package: the controller's import the kubernetes
    client (tens of MiB and hundreds of milliseconds), which ``tranche kubelet-plugin``
    must not pay for, so :func:`main` loads only the command it runs.
    """
    found = entry_points(group="tranche.commands")
    if only is not None and only in found.names:
        found = found.select(name=only)
    commands: dict[str, Command] = {}
    for ep in found:
        cmd = ep.load()
        if isinstance(cmd, Command):
            commands[ep.name] = cmd
    return commands


def build_parser(commands: dict[str, Command]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tranche",
        description="Tranche: a Kubernetes DRA driver for NVIDIA GPUs.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in sorted(commands):
        cmd = commands[name]
        p = sub.add_parser(name, help=cmd.help, description=cmd.help)
        cmd.add_arguments(p)
        p.set_defaults(_run=cmd.run)
    return parser


def main(argv: Sequence[str] | None = None, *, process_start: bool = False) -> int:
    """Run one ``tranche`` command. ``process_start``: this is the process's own start, so
    the garbage collector pauses while the command loads (:mod:`driver.startup_gc`)."""
    first = next((a for a in (sys.argv[1:] if argv is None else argv) if a[:1] != "-"), None)
    if process_start:
        startup_gc.pause()  # loading the command is most of the objects the process will hold
    try:
        parser = build_parser(load_commands(first))
        args = parser.parse_args(argv)
    except ConfigError as e:  # an environment twin's value: read as the flags are added,
        # or (a flag's choices) checked as they are parsed
        print(f"tranche {first}: {e}" if first else f"tranche: {e}", file=sys.stderr)
        return 2
    finally:
        if process_start:
            startup_gc.resume()
    run: Callable[[argparse.Namespace], int] = args._run
    return run(args)


def process_main() -> int:
    """The ``tranche`` executable and ``python -m driver.cli``."""
    return main(process_start=True)
