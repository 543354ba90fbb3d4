"""API answers as JSON, with bounded nesting: no answer escapes as an exception.

``json.loads`` recurses once per nested array or object, so a claim whose opaque
parameters nest a few thousand arrays (4 KiB of ``[``) raises :class:`RecursionError`,
and an integer of more than 4300 digits raises a bare ``ValueError``; either would fail
a whole list or a whole kubelet call for one bad object. :func:`decode` bounds both:

* values nested deeper than :data:`MAX_DEPTH` arrays/objects, and numbers longer than
  :data:`MAX_NUMBER_CHARS` characters, are **cut**: replaced by ``null`` and reported as
  :class:`Cut` (where, what), found by an iterative scan that needs no recursion;
* the rest is parsed by ``json.loads`` as usual (so invalid JSON is still a
  ``ValueError``).

:func:`decode_object` is what :class:`driver.kube.http.RawAnswer` uses: a single object
with a cut value is refused (:class:`JsonTooDeep`, naming the field); in a list answer
(``items``) each object with a cut value is kept without the cut values and marked
with :data:`UNDECODABLE`, whose text names the field: :func:`undecodable` reads it, so a
caller reports that object and goes on with the others.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

MAX_DEPTH = 64  # Kubernetes objects nest about 10 deep; only user parameters go further
MAX_NUMBER_CHARS = 1000  # Python refuses integers of more than 4300 digits
UNDECODABLE = "tranche.dev/undecodable"  # set on a list item whose values were cut
_PATH_SHOWN = 8

_TOKEN = re.compile(
    r"""[ \t\n\r]*(?:
      (?P<open>[\[{])
    | (?P<close>[\]}])
    | (?P<comma>,)
    | (?P<colon>:)
    | (?P<string>"(?:[^"\\]|\\.)*")
    | (?P<number>-?[0-9][0-9.eE+-]*)
    | (?P<literal>true|false|null)
    )""",
    re.VERBOSE | re.DOTALL,
)


class JsonTooDeep(ValueError):
    """A JSON document held a value nested too deep (or a number too long) to accept."""


@dataclass(frozen=True)
class Cut:
    """A value replaced by ``null``: ``path`` (keys and indices) and why."""

    path: tuple[str | int, ...]
    why: str

    def describe(self, skip: int = 0) -> str:
        return f"{format_path(self.path[skip:])}: {self.why}"


def format_path(path: tuple[str | int, ...]) -> str:
    """``spec.devices.config[0].opaque.parameters[0][0]… (+2041 levels)``."""
    shown, rest = path[:_PATH_SHOWN], len(path) - _PATH_SHOWN
    out = ""
    for part in shown:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else part)
    if rest > 0:
        out += f"… (+{rest} levels)"
    return out or "(the document)"


def _depth_within(doc: Any, limit: int) -> bool:
    """Whether ``doc`` nests at most ``limit`` arrays/objects (iterative)."""
    level: list[Any] = [doc] if isinstance(doc, dict | list) else []
    depth = 0
    while level:
        depth += 1
        if depth > limit:
            return False
        below: list[Any] = []
        for value in level:
            for child in value.values() if isinstance(value, dict) else value:
                if isinstance(child, dict | list):
                    below.append(child)
        level = below
    return True


def _scan(text: str, max_depth: int) -> tuple[list[tuple[int, int]], list[Cut]]:
    """Spans of ``text`` to replace by ``null`` and why; stops quietly at invalid JSON
    (``json.loads`` reports it afterwards)."""
    spans: list[tuple[int, int]] = []
    cuts: list[Cut] = []
    # one frame per open container: [is_object, key or index, expecting a key]
    stack: list[list[Any]] = []
    pos = 0
    end = len(text)
    while pos < end:
        m = _TOKEN.match(text, pos)
        if m is None:
            break
        kind = m.lastgroup
        start = m.start(kind) if kind else pos
        pos = m.end()
        top = stack[-1] if stack else None
        if kind == "string" and top is not None and top[0] and top[2]:
            try:
                top[1] = json.loads(m.group(kind))
            except ValueError:
                break
            top[2] = False
        elif kind == "comma" and top is not None:
            if top[0]:
                top[2] = True
            else:
                top[1] += 1
        elif kind == "open":
            if len(stack) >= max_depth:
                pos = _skip_container(text, pos)
                spans.append((start, pos))
                cuts.append(Cut(_path(stack), f"nested deeper than {max_depth} levels"))
                continue
            is_object = m.group(kind) == "{"
            stack.append([is_object, None if is_object else 0, is_object])
        elif kind == "close":
            if not stack:
                break
            stack.pop()
        elif kind == "number" and len(m.group(kind)) > MAX_NUMBER_CHARS:
            spans.append((start, pos))
            cuts.append(Cut(_path(stack), f"a number of {len(m.group(kind))} characters"))
    return spans, cuts


def _path(stack: list[list[Any]]) -> tuple[str | int, ...]:
    return tuple(frame[1] if frame[1] is not None else "?" for frame in stack)


def _skip_container(text: str, pos: int) -> int:
    """The end of the container whose opening bracket ends just before ``pos``."""
    depth = 1
    end = len(text)
    while depth and pos < end:
        m = _TOKEN.match(text, pos)
        if m is None:
            return end
        pos = m.end()
        if m.lastgroup == "open":
            depth += 1
        elif m.lastgroup == "close":
            depth -= 1
    return pos


def decode(body: bytes | str, max_depth: int = MAX_DEPTH) -> tuple[Any, list[Cut]]:
    """The JSON value of ``body`` with too deep values and too long numbers cut (``null``),
    and what was cut. ``ValueError`` when ``body`` is not JSON."""
    text = body.decode("utf-8", errors="replace") if isinstance(body, bytes) else body
    try:
        doc = json.loads(text)
    except RecursionError:
        pass
    except ValueError as e:
        if "integer string conversion" not in str(e):
            raise
    else:
        shallow = text.count("[") + text.count("{") <= max_depth  # fewer brackets than levels
        if shallow or _depth_within(doc, max_depth):
            return doc, []
    spans, cuts = _scan(text, max_depth)
    if not cuts:  # not JSON after all (json.loads says why), or recursion on something else
        try:
            return json.loads(text), []
        except RecursionError as e:
            raise JsonTooDeep(f"JSON nested too deep to read: {e}") from e
    parts, last = [], 0
    for start, stop in spans:
        parts.append(text[last:start])
        parts.append("null")
        last = stop
    parts.append(text[last:])
    try:
        return json.loads("".join(parts)), cuts
    except RecursionError as e:  # a deep value the scan missed: refuse the document
        raise JsonTooDeep(f"JSON nested too deep to read: {e}") from e


def decode_object(body: bytes | str, max_depth: int = MAX_DEPTH) -> dict[str, Any]:
    """An API answer: a JSON object (``{}`` when empty).

    A list answer keeps each item with a cut value, without it, marked with
    :data:`UNDECODABLE`; any other cut refuses the answer with :class:`JsonTooDeep`
    naming the field. ``ValueError`` when it is not a JSON object.
    """
    if not body:
        return {}
    doc, cuts = decode(body, max_depth)
    if not isinstance(doc, dict):
        raise ValueError(f"expected a JSON object, got {type(doc).__name__}")
    if not cuts:
        return doc
    items = doc.get("items")
    outside = [c for c in cuts if not (len(c.path) > 1 and c.path[0] == "items")]
    if outside or not isinstance(items, list):
        raise JsonTooDeep(f"{_name(doc)}: {cuts[0].describe()}; not read")
    list_kind = str(doc.get("kind") or "")
    item_kind = list_kind.removesuffix("List") if list_kind.endswith("List") else "object"
    for cut in cuts:
        index = cut.path[1]
        if isinstance(index, int) and 0 <= index < len(items) and isinstance(items[index], dict):
            item = items[index]
            note = f"{_name(item, item_kind)}: {cut.describe(skip=2)}; not read"
            item.setdefault(UNDECODABLE, note)
    return doc


def undecodable(obj: Mapping[str, Any]) -> str | None:
    """Why a list item could not be read whole (its name and field), or None."""
    note = obj.get(UNDECODABLE)
    return str(note) if note is not None else None


def _name(obj: Mapping[str, Any], kind_if_unset: str = "object") -> str:
    """``ResourceClaim team-a/train``; items of a list carry no kind: the list's gives it."""
    kind = obj.get("kind") or kind_if_unset
    meta = obj.get("metadata")
    if not isinstance(meta, dict) or not meta.get("name"):
        return str(kind)
    ns = f"{meta['namespace']}/" if meta.get("namespace") else ""
    return f"{kind} {ns}{meta['name']}"
