"""Comparing desired ResourceSlices with what the API server holds (pure).

The API server writes quantities in canonical form, drops empty maps and
lists, and adds ``timeAdded`` to taints that lack it. :func:`content` removes
those differences, so that equal content compares equal, and
:func:`lost_fields` names what the server did not keep of a write (a field
behind a feature gate that is off is dropped silently).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from driver.quantity import parse_quantity

Json = dict[str, Any]


def _pruned_copy(value: Any) -> Any:
    """A deep copy of JSON data without the members whose value is null, ``{}`` or ``[]``
    (after pruning theirs): what the API server drops. One pass, new containers throughout,
    so the caller may change the copy (``copy.deepcopy`` then a pruning pass took five times
    as long on a node's slices)."""
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            if isinstance(v, dict | list | tuple):
                pruned = _pruned_copy(v)
                if pruned:
                    out[k] = pruned
            elif v is not None:
                out[k] = v
        return out
    if isinstance(value, list | tuple):
        return [_pruned_copy(v) if isinstance(v, dict | list | tuple) else v for v in value]
    return value


def _copy(value: Any) -> Any:
    """A deep copy of JSON data that shares its strings and numbers (immutable), as
    ``copy.deepcopy`` does, at a fraction of its cost (no memo of what was copied)."""
    if isinstance(value, dict):
        return {k: _copy(v) if isinstance(v, dict | list) else v for k, v in value.items()}
    if isinstance(value, list):
        return [_copy(v) if isinstance(v, dict | list) else v for v in value]
    return value


def _quantity(value: Any, memo: dict[Any, Any]) -> Any:
    # A node's slices repeat a few dozen values hundreds of times: each is parsed once per
    # slice compared. The memo lives for that comparison only; nothing is kept between them.
    if not isinstance(value, str):
        return _canonical(value)
    found = memo.get(value)
    if found is None:
        found = memo[value] = _canonical(value)
    return found


def _canonical(value: Any) -> Any:
    try:
        q = parse_quantity(value)
    except (ValueError, TypeError):
        return value
    return format(q.normalize(), "f")


def _normalize_quantities(spec: Json) -> None:
    memo: dict[Any, Any] = {}
    for device in spec.get("devices") or []:
        for cap in (device.get("capacity") or {}).values():
            if "value" in cap:
                cap["value"] = _quantity(cap["value"], memo)
        for use in device.get("consumesCounters") or []:
            for c in (use.get("counters") or {}).values():
                c["value"] = _quantity(c["value"], memo)
    for cs in spec.get("sharedCounters") or []:
        for c in (cs.get("counters") or {}).values():
            c["value"] = _quantity(c["value"], memo)


def _drop_server_times(got: Json, want: Json) -> None:
    """Forget ``timeAdded`` the server filled in for taints that were written without one."""
    want_devices = {d.get("name"): d for d in want.get("devices") or []}
    for device in got.get("devices") or []:
        wanted = want_devices.get(device.get("name"), {}).get("taints") or []
        for i, taint in enumerate(device.get("taints") or []):
            if i >= len(wanted) or "timeAdded" not in wanted[i]:
                taint.pop("timeAdded", None)


def content(spec: Mapping[str, Any], like: Mapping[str, Any] | None = None) -> Json:
    """``spec`` without its pool generation, in a form that compares equal when equivalent.

    ``like`` is the desired spec when ``spec`` comes from the API server.
    """
    out: Json = _pruned_copy(dict(spec))
    pool = out.get("pool")
    if pool is not None:
        pool.pop("generation", None)
        if not pool:
            del out["pool"]
    if like is not None:
        _drop_server_times(out, dict(like))
    _normalize_quantities(out)
    return out


def digest(slices: Sequence[Mapping[str, Any]]) -> str:
    """A fingerprint of a desired set of slices (names and content)."""
    body = [[s["metadata"]["name"], content(s["spec"])] for s in slices]
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def lost_fields(want: Any, got: Any, path: str = "spec") -> list[str]:
    """Paths of ``want`` that ``got`` lacks or holds with another value."""
    if isinstance(want, dict):
        if not isinstance(got, dict):
            return [path]
        out: list[str] = []
        for k, v in want.items():
            if k not in got:
                out.append(f"{path}.{k}")
            else:
                out.extend(lost_fields(v, got[k], f"{path}.{k}"))
        return out
    if isinstance(want, list):
        if not isinstance(got, list) or len(got) != len(want):
            return [path]
        out = []
        for i, (w, g) in enumerate(zip(want, got, strict=True)):
            label = w.get("name") if isinstance(w, dict) and "name" in w else i
            out.extend(lost_fields(w, g, f"{path}[{label}]"))
        return out
    return [] if want == got else [path]


@dataclass
class Plan:
    """What one sync writes: slice bodies to create or replace, names to delete."""

    generation: int
    create: list[Json] = field(default_factory=list)
    replace: list[Json] = field(default_factory=list)
    delete: list[str] = field(default_factory=list)
    bumped: bool = False

    @property
    def empty(self) -> bool:
        return not (self.create or self.replace or self.delete)


def owner_ok(obj: Mapping[str, Any], node_uid: str) -> bool:
    refs = (obj.get("metadata") or {}).get("ownerReferences") or []
    return any(r.get("kind") == "Node" and r.get("uid") == node_uid for r in refs)


def plan(
    desired: Sequence[Mapping[str, Any]],
    existing: Sequence[Mapping[str, Any]],
    *,
    node_name: str,
    node_uid: str,
    known_generation: int,
    known_digest: str | None,
    desired_digest: str | None = None,
) -> Plan:
    """The writes that make ``existing`` equal ``desired``.

    Nothing is written when the API server already holds the desired slices
    at one generation (e.g. after a plugin restart). Otherwise the pool
    generation is bumped, unless the desired content is what was last
    published at ``known_generation``: slices deleted or edited behind our
    back are then restored at that generation. ``desired_digest``: ``digest(desired)``,
    when the caller keeps it (it is computed otherwise).
    """
    have = {o["metadata"]["name"]: o for o in existing}
    generations = {int(o["spec"]["pool"].get("generation", 0)) for o in existing}
    top = max(generations | {known_generation})

    def body(s: Mapping[str, Any], gen: int) -> Json:
        b: Json = _copy(s)
        meta = b.setdefault("metadata", {})
        meta["ownerReferences"] = [
            {"apiVersion": "v1", "kind": "Node", "name": node_name, "uid": node_uid,
             "controller": True}
        ]  # fmt: skip
        b["spec"]["pool"]["generation"] = gen
        b["spec"]["pool"]["resourceSliceCount"] = len(desired)
        return b

    # content() ignores the generation, so each slice's contents are compared once.
    same_content: dict[str, bool] = {}

    def same(name: str, want: Json, gen: int) -> bool:
        old = have[name]
        if int(old["spec"]["pool"].get("generation", 0)) != gen or not owner_ok(old, node_uid):
            return False
        if name not in same_content:
            same_content[name] = content(old["spec"], like=want["spec"]) == content(want["spec"])
        return same_content[name]

    wanted = {s["metadata"]["name"]: s for s in desired}
    if len(generations) == 1 and set(have) == set(wanted):
        (current,) = generations
        if all(same(n, body(s, current), current) for n, s in wanted.items()):
            return Plan(generation=current)

    if desired_digest is None:
        desired_digest = digest(desired)
    same_desire = known_digest == desired_digest and known_generation >= top
    gen = known_generation if same_desire else top + 1
    result = Plan(generation=gen, bumped=not same_desire)
    for name, s in wanted.items():
        want = body(s, gen)
        old = have.get(name)
        if old is None:
            result.create.append(want)
        elif not same(name, want, gen):
            want["metadata"]["resourceVersion"] = old["metadata"].get("resourceVersion")
            result.replace.append(want)
    result.delete = sorted(n for n in have if n not in wanted)
    return result
