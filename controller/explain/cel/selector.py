"""Compiling a selector (:func:`compile_selector`) and evaluating it on devices
(:class:`Selector`), with results cached by what the expression can read of a device."""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import celpy.celtypes as ct
import lark
from celpy.celparser import CELParseError
from celpy.evaluation import CELEvalError as CelpyEvalError

from controller.explain.cel import checks, extensions
from controller.explain.cel.compare import OPERATORS
from controller.explain.cel.device import DeviceData, activation
from controller.explain.cel.grammar import environment
from controller.explain.cel.interpreter import OptionalRunner
from controller.explain.cel.library import FUNCTIONS
from controller.explain.cel.optional import OPTIONAL_FUNCTIONS
from controller.explain.cel.values import CelEvalError, CelSyntaxError


def _frozen(value: Any) -> Any:
    if isinstance(value, Mapping):
        return tuple(sorted((str(k), _frozen(v)) for k, v in value.items()))
    if isinstance(value, list | tuple):
        return tuple(_frozen(v) for v in value)
    return value


_ENV = environment(OptionalRunner)
# calls that may read every value of a map: its attributes all count for the cache key
_MACROS = re.compile(
    r"\.\s*(exists|exists_one|existsOne|all|map|filter|transformList|transformMap"
    r"|transformMapEntry|sortBy|format)\s*\("
)


@dataclass(frozen=True)
class Selector:
    """One compiled CEL selector. Results are cached by what the expression can read of a
    device: attributes and capacities whose names it does not mention are left out of the
    key, so devices that differ only in UUIDs or bus IDs are evaluated once."""

    expression: str
    program: Any
    _cache: dict[Any, bool | str] = field(default_factory=dict, compare=False, repr=False)
    _names: dict[str, bool] = field(default_factory=dict, compare=False, repr=False)
    _kept_names: dict[tuple[str, ...], tuple[str, ...]] = field(
        default_factory=dict, compare=False, repr=False
    )

    def _keep(self, name: str) -> bool:
        kept = self._names.get(name)
        if kept is None:
            kept = bool(_MACROS.search(self.expression)) or (
                name.rsplit("/", 1)[-1] in self.expression
            )
            self._names[name] = kept
        return kept

    def _kept(self, names: tuple[str, ...]) -> tuple[str, ...]:
        """The names of ``names`` the expression may read (cached: devices of one kind share
        their attribute names)."""
        kept = self._kept_names.get(names)
        if kept is None:
            kept = tuple(n for n in names if self._keep(n))
            self._kept_names[names] = kept
        return kept

    def _key(self, device: DeviceData) -> Any:
        attributes, capacity = device.attributes, device.capacity
        names = tuple(attributes)
        return (
            device.driver,
            device.allow_multiple_allocations,
            tuple((k, _frozen(attributes[k])) for k in self._kept(names)),
            # CEL sees a capacity's value only, never its request policy
            tuple(
                (k, v.get("value") if isinstance(v, Mapping) else v)
                for k in self._kept(tuple(capacity))
                for v in (capacity[k],)
            ),
            # which names exist matters to `in` and has(): keep them all
            names,
        )

    def matches(self, device: DeviceData) -> bool:
        key = self._key(device)
        cached = self._cache.get(key)
        if cached is None:
            try:
                cached = self._evaluate(device)
            except CelEvalError as e:
                cached = str(e)
            self._cache[key] = cached
        if isinstance(cached, str):
            raise CelEvalError(cached)
        return cached

    def _evaluate(self, device: DeviceData) -> bool:
        try:
            result = self.program.evaluate(activation(device))
        except CelpyEvalError as e:
            raise CelEvalError(_eval_message(e)) from e
        except (CelEvalError, TypeError, ValueError, KeyError, ArithmeticError) as e:
            raise CelEvalError(str(e)) from e
        if isinstance(result, CelpyEvalError):
            raise CelEvalError(_eval_message(result))
        if not isinstance(result, ct.BoolType | bool):
            raise CelEvalError(f"the expression returned {result!r}, not a bool")
        return bool(result)


def _eval_message(e: CelpyEvalError) -> str:
    text = str(e.args[0]) if e.args else str(e)
    if len(e.args) > 2 and e.args[1] is KeyError and e.args[2]:
        key = e.args[2][0] if isinstance(e.args[2], tuple) and e.args[2] else e.args[2]
        text = f"no such key: {key}"
    return text


@functools.lru_cache(maxsize=1024)
def compile_selector(expression: str) -> Selector:
    """Compile ``expression``; :class:`CelSyntaxError` with the position when it does not
    parse or cel-go would not compile it (``checks.py``)."""
    try:
        ast = _ENV.compile(expression)
    except (CELParseError, lark.exceptions.LarkError) as e:
        line, column = getattr(e, "line", None), getattr(e, "column", None)
        if isinstance(line, int) and isinstance(column, int) and column > 0:
            where = checks.where(expression, line, column)
        else:
            where = f": {str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__}"
        raise CelSyntaxError(f"CEL expression does not parse{where}") from e
    checks.check(expression, ast)
    extensions.check(ast)
    functions = {**FUNCTIONS, **extensions.FUNCTIONS, **OPTIONAL_FUNCTIONS, **OPERATORS}
    program = _ENV.program(ast, functions=functions)
    return Selector(expression, program)
