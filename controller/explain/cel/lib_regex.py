"""Kubernetes' regex CEL library, as :data:`FUNCTIONS`: ``s.find(re)`` (the first match, or
``""``) and ``s.findAll(re[, n])`` (up to ``n`` matches, all when ``n`` is negative), with RE2
as Go's ``regexp`` and its ``FindAllString``: an empty match right after a match is skipped."""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

import celpy.celtypes as ct
import re2  # type: ignore[import-untyped]

from controller.explain.cel.values import CelEvalError, returning_errors

_OPTIONS = re2.Options()
_OPTIONS.log_errors = False  # RE2 would write a bad pattern to stderr, into explain's output


@functools.lru_cache(maxsize=256)
def _compiled(pattern: str) -> Any:
    try:
        return re2.compile(pattern, _OPTIONS)
    except re2.error as e:
        why = e.args[0].decode() if e.args and isinstance(e.args[0], bytes) else str(e)
        raise CelEvalError(f"Illegal regex: {why}") from e


def _strings(text: Any, pattern: Any, name: str) -> tuple[str, str]:
    if not isinstance(text, str) or not isinstance(pattern, str):
        raise TypeError(f"no such overload: {name} needs strings")
    return str(text), str(pattern)


def _find(text: Any, pattern: Any) -> ct.StringType:
    s, p = _strings(text, pattern, "find")
    match = _compiled(p).search(s)
    return ct.StringType(match.group(0) if match else "")


def _find_all(text: Any, pattern: Any, limit: Any = -1) -> ct.ListType:
    s, p = _strings(text, pattern, "findAll")
    regex, n = _compiled(p), int(limit)
    found: list[ct.StringType] = []
    pos, previous_end = 0, -1
    while (n < 0 or len(found) < n) and pos <= len(s):
        match = regex.search(s, pos)
        if match is None:
            break
        start, end = match.span()
        accept = True
        if end == start:  # an empty match
            accept = start != previous_end
            pos = end + 1
        else:
            pos = end
        previous_end = end
        if accept:
            found.append(ct.StringType(match.group(0)))
    return ct.ListType(found)


FUNCTIONS: Mapping[str, Callable[..., Any]] = returning_errors(
    {"find": _find, "findAll": _find_all}
)
