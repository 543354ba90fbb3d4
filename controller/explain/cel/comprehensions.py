"""The macros of the DRA selector environment that cel-python does not have, evaluated as
cel-go expands them: the two-variable comprehensions of ``ext.TwoVarComprehensions`` (in
Kubernetes' base environment since 1.32) over a list (index, element) or a map (key, value):
``all(i, v, p)``, ``exists(i, v, p)``, ``existsOne(i, v, p)`` (and ``exists_one``),
``transformList(i, v, [filter,] expr)``, ``transformMap(i, v, [filter,] expr)``,
``transformMapEntry(i, v, [filter,] {k: v})``; ``sortBy(x, key)`` of ``ext.Lists``; and of
CEL's own macros, the three-argument ``map(x, filter, transform)``, which cel-python cannot
expand, and ``all(x, p)``, ``exists(x, p)``, ``exists_one(x, p)``, whose errors cel-python
cannot combine (two error values crash it).

As in cel-go, ``all`` stops at the first false and ``exists`` at the first true, where an
error elsewhere does not matter; otherwise an error in a predicate or a transform is the
result (an error value, never an exception)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import celpy.celtypes as ct
import lark
from celpy.evaluation import CELEvalError as CelpyEvalError

from controller.explain.cel.lib_lists import sort_by_keys
from controller.explain.cel.values import CelEvalError

Tree = lark.Tree[Any]

TWO_VARIABLE: Mapping[str, tuple[int, ...]] = {
    "all": (3,),
    "exists": (3,),
    "existsOne": (3,),
    "exists_one": (3,),
    "transformList": (3, 4),
    "transformMap": (3, 4),
    "transformMapEntry": (3, 4),
}
"""Macro name -> the argument counts that make it a two-variable comprehension."""


def _bool(value: Any) -> Any:
    """``value`` as a predicate result: a bool, an error value, or a no-such-overload error."""
    if isinstance(value, ct.BoolType | CelpyEvalError):
        return value
    return CelpyEvalError(f"no such overload: a predicate returned {value!r}, not a bool")


def _is(value: Any, truth: bool) -> bool:
    return isinstance(value, ct.BoolType) and bool(value) is truth


class _Body:
    """The expressions of one comprehension, evaluated with its two variables bound."""

    def __init__(self, evaluator: Any, names: tuple[str, ...], nodes: list[Tree]) -> None:
        self.names = names
        self.evaluators = [evaluator.sub_evaluator(node) for node in nodes]

    def run(self, index: int, pair: tuple[Any, ...]) -> Any:
        try:
            return self.evaluators[index].evaluate(dict(zip(self.names, pair, strict=True)))
        except CelpyEvalError as e:
            return e


ONE_VARIABLE = frozenset({"all", "exists", "exists_one"})
"""CEL's quantifier macros over one variable (a list's elements or a map's keys)."""


def _pairs(target: Any) -> list[tuple[Any, Any]] | None:
    if isinstance(target, list):
        return [(ct.IntType(i), v) for i, v in enumerate(target)]
    if isinstance(target, Mapping):
        return list(target.items())
    return None


def _quantifier(name: str, body: _Body, pairs: list[tuple[Any, ...]]) -> Any:
    """``all`` (``accu && p`` while accu is not false), ``exists`` (``accu || p`` while accu is
    not true), ``existsOne`` (every element, any error is the result)."""
    if name in {"all", "exists"}:
        decided = name == "exists"  # the value that ends the loop: true for exists
        accu: Any = ct.BoolType(not decided)
        for pair in pairs:
            if _is(accu, decided):
                break
            value = _bool(body.run(0, pair))
            if _is(value, decided) or not isinstance(accu, CelpyEvalError):
                accu = value  # else an error so far stays, unless the value decides
        return accu
    count, error = 0, None
    for pair in pairs:
        value = _bool(body.run(0, pair))
        if isinstance(value, CelpyEvalError):
            error = error or value
        elif value:
            count += 1
    return error if error is not None else ct.BoolType(count == 1)


def _transform(name: str, body: _Body, pairs: list[tuple[Any, Any]], filtered: bool) -> Any:
    items: list[Any] = []
    entries: dict[Any, Any] = {}
    for pair in pairs:
        if filtered:
            keep = _bool(body.run(0, pair))
            if isinstance(keep, CelpyEvalError):
                return keep
            if not keep:
                continue
        value = body.run(1 if filtered else 0, pair)
        if isinstance(value, CelpyEvalError):
            return value
        if name == "transformList":
            items.append(value)
        elif name == "transformMap":
            entries[pair[0]] = value
        else:
            if not isinstance(value, Mapping):
                return CelpyEvalError(f"no such overload: transformMapEntry needs a map: {value!r}")
            for key, item in value.items():
                if key in entries:
                    return CelpyEvalError(f"insert failed: key {key} already exists")
                entries[key] = item
    return ct.ListType(items) if name == "transformList" else ct.MapType(entries)


def two_variable(evaluator: Any, tree: Tree, names: tuple[str, str]) -> Any:
    """``target.name(names[0], names[1], ...)``, the arguments checked when compiled."""
    name = str(tree.children[1])
    nodes = tree.children[2].children[2:]
    target = evaluator.visit(tree.children[0])
    if isinstance(target, CelpyEvalError):
        return target
    pairs = _pairs(target)
    if pairs is None:
        return CelpyEvalError(f"no such overload: {name} over {type(target).__name__}")
    body = _Body(evaluator, names, nodes)
    if name in {"all", "exists", "existsOne", "exists_one"}:
        quantifier = "existsOne" if name == "exists_one" else name
        return _quantifier(quantifier, body, pairs)
    return _transform(name, body, pairs, filtered=len(nodes) == 2)


def one_variable(evaluator: Any, tree: Tree, name: str) -> Any:
    """``target.all(name, p)``, ``exists`` or ``exists_one``, as the two-variable ones: over a
    list's elements or a map's keys."""
    macro = str(tree.children[1])
    target = evaluator.visit(tree.children[0])
    if isinstance(target, CelpyEvalError):
        return target
    if not isinstance(target, list | Mapping):
        return CelpyEvalError(f"no such overload: {macro} over {type(target).__name__}")
    body = _Body(evaluator, (name,), [tree.children[2].children[1]])
    items = [(item,) for item in target]
    return _quantifier("existsOne" if macro == "exists_one" else macro, body, items)


def map_filtered(evaluator: Any, tree: Tree, name: str) -> Any:
    """``target.map(name, filter, transform)``: the transform of each element (a map's keys)
    the filter holds for; as cel-go, the transform is not evaluated where the filter fails,
    and an error in either is the result."""
    target = evaluator.visit(tree.children[0])
    if isinstance(target, CelpyEvalError):
        return target
    if not isinstance(target, list | Mapping):
        return CelpyEvalError(f"no such overload: map over {type(target).__name__}")
    keep, transform = (evaluator.sub_evaluator(node) for node in tree.children[2].children[1:])
    items = []
    for item in target:
        try:
            held = _bool(keep.evaluate({name: item}))
            if isinstance(held, CelpyEvalError):
                return held
            if held:
                value = transform.evaluate({name: item})
                if isinstance(value, CelpyEvalError):
                    return value
                items.append(value)
        except CelpyEvalError as e:
            return e
    return ct.ListType(items)


def sort_by(evaluator: Any, tree: Tree, name: str) -> Any:
    """``target.sortBy(name, key)``: the list ordered by each element's key."""
    target = evaluator.visit(tree.children[0])
    if isinstance(target, CelpyEvalError):
        return target
    if not isinstance(target, list):
        return CelpyEvalError(f"no such overload: sortBy over {type(target).__name__}")
    key = evaluator.sub_evaluator(tree.children[2].children[1])
    keys = []
    for item in target:
        try:
            keys.append(key.evaluate({name: item}))
        except CelpyEvalError as e:
            return e
    return _call(sort_by_keys, target, ct.ListType(keys))


def _call(function: Callable[..., Any], *args: Any) -> Any:
    try:
        return function(*args)
    except CelEvalError as e:
        return CelpyEvalError(str(e))
