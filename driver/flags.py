"""Command-line flags with environment-variable twins.

Every flag ``--some-flag`` can also be set through ``TRANCHE_SOME_FLAG``; the
flag wins over the environment. Values are collected raw here and validated
once by the command's pydantic settings model; :func:`number` and :func:`choice` convert
and check a value first, so that an error names the flag and its twin. A flag's ``choices``
are checked by :func:`add_flag` itself, as argparse parses (argparse alone checks them only
of a value given on the command line, not of a twin's), so no command can forget them.
"""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TypeVar

from pydantic import ValidationError

from driver.errors import ConfigError

N = TypeVar("N", int, float)

_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})
_ADDRESS = re.compile(r"^(?P<host>[^:]*|\[[0-9a-fA-F:]+\]):(?P<port>\d{1,5})$")


def env_name(flag: str) -> str:
    """``--kubelet-root-dir`` → ``TRANCHE_KUBELET_ROOT_DIR``."""
    return "TRANCHE_" + flag.lstrip("-").upper().replace("-", "_")


def named(flag: str) -> str:
    """How an error names a flag that may have come from its twin: ``--flag [env TRANCHE_FLAG]``."""
    return f"{flag} [env {env_name(flag)}]"


def invalid_setting(error: ValidationError, args: argparse.Namespace) -> ConfigError:
    """A settings model's validation ``error`` as one line per field that names the flag and
    its twin the value came from (the field ``sample_interval_s`` is the flag
    ``--sample-interval``): what an operator sets, not the model's field name."""
    given = vars(args)
    parts = []
    for e in error.errors():
        field = str(e["loc"][0]) if e["loc"] else ""
        dest = next((d for d in (field, field.removesuffix("_s")) if d in given), None)
        message = str(e["msg"]).removeprefix("Value error, ")
        if message.startswith("--"):
            parts.append(message)  # a validator that named its flag already
        elif dest is None:
            parts.append(f"{field}: {message}")
        else:
            flag = "--" + dest.replace("_", "-")
            parts.append(f"{named(flag)}: {message} (got {e['input']!r})")
    return ConfigError("invalid setting: " + "; ".join(parts))


def number(value: str, flag: str, kind: type[N]) -> N:
    """``value`` of ``flag`` as an int or a float; a ConfigError naming the flag and its twin."""
    try:
        return kind(value)
    except ValueError:
        what = "a whole number" if kind is int else "a number"
        raise ConfigError(f"{named(flag)}: {value!r} is not {what}") from None


def choice(value: str, flag: str, choices: tuple[str, ...]) -> str:
    """``value`` of ``flag`` when it is one of ``choices``; else a ConfigError naming the flag,
    its twin and the choices."""
    if value not in choices:
        raise ConfigError(f"{named(flag)}: {value!r} is not one of {', '.join(choices)}")
    return value


def add_flag(
    parser: argparse.ArgumentParser,
    flag: str,
    help: str,
    *,
    default: str | None = None,
    env: Mapping[str, str] | None = None,
    choices: tuple[str, ...] | None = None,
) -> None:
    """Add ``flag``; its default comes from the environment twin, then ``default``.

    With ``choices``, a value that is not one of them, from the flag or from its twin, ends
    the parse with a ConfigError naming both (argparse converts a string default only when
    the flag is not given, so the flag still wins over a bad twin, and ``--help`` works)."""
    environ = os.environ if env is None else env
    name = env_name(flag)
    value = environ.get(name, default)
    suffix = f" [env {name}]" + (f" (default: {default})" if default is not None else "")
    if choices:
        parser.add_argument(
            flag, default=value, help=help + suffix, choices=choices, type=_one_of(flag, choices)
        )
    else:
        parser.add_argument(flag, default=value, help=help + suffix)


def _one_of(flag: str, choices: tuple[str, ...]) -> Callable[[str], str]:
    def check(value: str) -> str:
        return choice(value, flag, choices)

    return check


def add_switch(
    parser: argparse.ArgumentParser,
    flag: str,
    help: str,
    *,
    default: bool = False,
    env: Mapping[str, str] | None = None,
) -> None:
    """A boolean flag; the twin accepts ``1/true/yes/on`` and ``0/false/no/off``, and any
    other value is a ConfigError naming it (a typo must not turn a safety check off)."""
    environ = os.environ if env is None else env
    name = env_name(flag)
    raw = environ.get(name, "").strip().lower()
    if raw:
        if raw not in _TRUE | _FALSE:
            raise ConfigError(
                f"{name}={environ[name]!r} (the twin of {flag}) is neither on "
                f"({', '.join(sorted(_TRUE))}) nor off ({', '.join(sorted(_FALSE))})"
            )
        default = raw in _TRUE
    parser.add_argument(
        flag, action=argparse.BooleanOptionalAction, default=default, help=f"{help} [env {name}]"
    )


def parse_address(value: str, field: str) -> tuple[str, int]:
    """``"127.0.0.1:9400"`` / ``"[::1]:9400"`` / ``":9400"`` → (host, port); the host of
    ``:PORT`` is ``""``, every address, IPv4 and IPv6 (``driver.http_server`` listens)."""
    m = _ADDRESS.match(value)
    if not m or not 0 <= int(m["port"]) <= 65535:
        raise ConfigError(f"{field}: {value!r} is not HOST:PORT")
    return (m["host"].strip("[]"), int(m["port"]))


def flag_text(value: str, source: str) -> tuple[str, str]:
    """A flag that takes inline text or ``@FILE``: (the text, ``source`` naming the file)."""
    if not value.startswith("@"):
        return value, source
    path = Path(value[1:])
    try:
        return path.read_text(encoding="utf-8"), f"{source} ({path})"
    except OSError as e:
        raise ConfigError(f"{source}: cannot read {path}: {e.strerror}") from e
