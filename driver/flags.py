"""Command-line flags with environment-variable twins.

Every flag ``--some-flag`` can also be set through ``TRANCHE_SOME_FLAG``; the
flag wins over the environment. Values are collected raw here and validated
once by the command's pydantic settings model.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping


def env_name(flag: str) -> str:
    """``--kubelet-root-dir`` → ``TRANCHE_KUBELET_ROOT_DIR``."""
    return "TRANCHE_" + flag.lstrip("-").upper().replace("-", "_")


def add_flag(
    parser: argparse.ArgumentParser,
    flag: str,
    help: str,
    *,
    default: str | None = None,
    env: Mapping[str, str] | None = None,
    choices: tuple[str, ...] | None = None,
) -> None:
    """Add ``flag``; its default comes from the environment twin, then ``default``."""
    environ = os.environ if env is None else env
    name = env_name(flag)
    value = environ.get(name, default)
    suffix = f" [env {name}]" + (f" (default: {default})" if default is not None else "")
    parser.add_argument(flag, default=value, help=help + suffix, choices=choices)


def add_switch(
    parser: argparse.ArgumentParser,
    flag: str,
    help: str,
    *,
    default: bool = False,
    env: Mapping[str, str] | None = None,
) -> None:
    """A boolean flag; the twin accepts ``1/true/yes/on`` and ``0/false/no/off``."""
    environ = os.environ if env is None else env
    name = env_name(flag)
    raw = environ.get(name, "").strip().lower()
    if raw:
        default = raw in {"1", "true", "yes", "on"}
    parser.add_argument(
        flag, action=argparse.BooleanOptionalAction, default=default, help=f"{help} [env {name}]"
    )
