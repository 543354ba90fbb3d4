"""CEL device selectors evaluated as kube-scheduler evaluates them, on ``cel-python``.

The environment is the one of DRA selectors (``resource.k8s.io``): one variable,
``device``, with ``driver``, ``attributes[domain].<id>``, ``capacity[domain].<id>``
and ``allowMultipleAllocations``. An unknown domain is an empty map; an unknown
attribute is an evaluation error (the scheduler then refuses the claim), which
``has(...)`` or ``"id" in device.attributes[domain]`` guard against.

``cel-python`` brings the CEL core and ``matches``; the Kubernetes extension
libraries that DRA selectors use are added here: quantities (``quantity``,
``isQuantity``, ``compareTo``, ``isGreaterThan``, ``isLessThan``, ``add``, ``sub``,
``sign``, ``isInteger``, ``asInteger``, ``asApproximateFloat``), semantic versions
(``semver``, ``isSemver``, ``major``, ``minor``, ``patch``, ``compareTo``,
``isGreaterThan``, ``isLessThan``) and the strings library (``lowerAscii``,
``upperAscii``, ``trim``, ``replace``, ``split``, ``join``, ``indexOf``,
``lastIndexOf``, ``substring``, ``charAt``). Version attributes arrive as semver
values and capacities as quantities, as in the scheduler.

``==``, ``!=``, ``in`` and the orderings follow cel-go, not cel-python: values of
different types are unequal rather than an error, numbers compare across int, uint and
double, and only a quantity or semantic version compared with another type fails.

Public: :func:`compile_selector` (raises :class:`CelSyntaxError`), :class:`Selector`
with ``matches(device) -> bool`` (raises :class:`CelEvalError`), :class:`Quantity`,
:class:`Semver`.
"""

from __future__ import annotations

import functools
import operator
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

import celpy
import celpy.celtypes as ct
import lark
from celpy.celparser import CELParseError
from celpy.evaluation import CELEvalError as CelpyEvalError

from driver.quantity import parse_quantity

__all__ = [
    "CelEvalError",
    "CelSyntaxError",
    "DeviceData",
    "Quantity",
    "Selector",
    "Semver",
    "compile_selector",
]


class CelSyntaxError(ValueError):
    """An expression that does not parse or uses an unknown function."""


class CelEvalError(Exception):
    """An expression that fails on one device (a missing attribute, a type mismatch)."""


@functools.total_ordering
class Quantity:
    """A Kubernetes quantity in CEL (``quantity("40Gi")``, ``device.capacity[...]``)."""

    def __init__(self, value: Decimal, text: str) -> None:
        self.value = value
        self.text = text

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Quantity) and self.value == other.value

    def __lt__(self, other: object) -> bool:
        if not isinstance(other, Quantity):
            return NotImplemented
        return self.value < other.value

    def __hash__(self) -> int:
        return hash(self.value)

    def __repr__(self) -> str:
        return f"quantity({self.text!r})"


_SEMVER = re.compile(
    r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
    r"(?:-([0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*))?(?:\+[0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*)?$"
)


@functools.total_ordering
class Semver:
    """A semantic version in CEL (``semver("1.2.3")``, version attributes)."""

    def __init__(self, text: str) -> None:
        m = _SEMVER.match(text)
        if m is None:
            raise CelEvalError(f"{text!r} is not a semantic version")
        self.text = text
        self.core = (int(m[1]), int(m[2]), int(m[3]))
        self.pre: tuple[tuple[int, int | str], ...] = tuple(
            (0, int(p)) if p.isdigit() else (1, p) for p in (m[4].split(".") if m[4] else [])
        )

    def _key(self) -> tuple[Any, ...]:
        # a release sorts after its pre-releases
        return (self.core, not self.pre, self.pre)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Semver) and self._key() == other._key()

    def __lt__(self, other: object) -> bool:
        if not isinstance(other, Semver):
            return NotImplemented
        return self._key() < other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        return f"semver({self.text!r})"


def _quantity(text: Any) -> Quantity:
    try:
        return Quantity(parse_quantity(str(text)), str(text))
    except ValueError as e:
        raise CelEvalError(str(e)) from e


def _is_quantity(text: Any) -> ct.BoolType:
    try:
        parse_quantity(str(text))
    except ValueError:
        return ct.BoolType(False)
    return ct.BoolType(True)


def _semver(text: Any, normalize: Any = False) -> Semver:
    raw = str(text)
    if normalize:
        raw = raw.removeprefix("v")
        parts = re.split(r"([-+])", raw, maxsplit=1)
        nums = parts[0].split(".")
        nums += ["0"] * (3 - len(nums))
        raw = ".".join(str(int(n)) if n.isdigit() else n for n in nums) + "".join(parts[1:])
    return Semver(raw)


def _is_semver(text: Any, normalize: Any = False) -> ct.BoolType:
    try:
        _semver(text, normalize)
    except (CelEvalError, ValueError):
        return ct.BoolType(False)
    return ct.BoolType(True)


def _ordered(a: Any, b: Any, name: str) -> tuple[Any, Any]:
    if isinstance(a, Quantity) and isinstance(b, Quantity):
        return a.value, b.value
    if isinstance(a, Semver) and isinstance(b, Semver):
        return a._key(), b._key()
    raise CelEvalError(
        f"no such overload: {name}({type(a).__name__}, {type(b).__name__}): "
        "both sides must be quantities or both semantic versions"
    )


def _compare_to(a: Any, b: Any) -> ct.IntType:
    x, y = _ordered(a, b, "compareTo")
    return ct.IntType((x > y) - (x < y))


def _greater(a: Any, b: Any) -> ct.BoolType:
    x, y = _ordered(a, b, "isGreaterThan")
    return ct.BoolType(x > y)


def _less(a: Any, b: Any) -> ct.BoolType:
    x, y = _ordered(a, b, "isLessThan")
    return ct.BoolType(x < y)


def _as_quantity(value: Any, name: str) -> Quantity:
    if isinstance(value, Quantity):
        return value
    if isinstance(value, ct.IntType | int) and not isinstance(value, bool):
        return Quantity(Decimal(int(value)), str(int(value)))
    raise CelEvalError(f"no such overload: {name} needs a quantity, not {type(value).__name__}")


def _add(a: Any, b: Any) -> Quantity:
    x, y = _as_quantity(a, "add"), _as_quantity(b, "add")
    v = x.value + y.value
    return Quantity(v, str(v))


def _sub(a: Any, b: Any) -> Quantity:
    x, y = _as_quantity(a, "sub"), _as_quantity(b, "sub")
    v = x.value - y.value
    return Quantity(v, str(v))


def _sign(a: Any) -> ct.IntType:
    v = _as_quantity(a, "sign").value
    return ct.IntType((v > 0) - (v < 0))


def _is_integer(a: Any) -> ct.BoolType:
    v = _as_quantity(a, "isInteger").value
    return ct.BoolType(v == v.to_integral_value() and abs(v) < 2**63)


def _as_integer(a: Any) -> ct.IntType:
    v = _as_quantity(a, "asInteger").value
    if v != v.to_integral_value() or abs(v) >= 2**63:
        raise CelEvalError(f"quantity {v} is not an integer that fits into int64")
    return ct.IntType(int(v))


def _as_float(a: Any) -> ct.DoubleType:
    return ct.DoubleType(float(_as_quantity(a, "asApproximateFloat").value))


def _version_part(index: int, name: str) -> Callable[[Any], ct.IntType]:
    def part(v: Any) -> ct.IntType:
        if not isinstance(v, Semver):
            raise CelEvalError(f"no such overload: {name} needs a semantic version")
        return ct.IntType(v.core[index])

    return part


def _string(value: Any, name: str) -> str:
    if not isinstance(value, ct.StringType | str):
        raise CelEvalError(f"no such overload: {name} needs a string, not {type(value).__name__}")
    return str(value)


def _lower(s: Any) -> ct.StringType:
    text = _string(s, "lowerAscii")
    return ct.StringType("".join(c.lower() if c.isascii() else c for c in text))


def _upper(s: Any) -> ct.StringType:
    text = _string(s, "upperAscii")
    return ct.StringType("".join(c.upper() if c.isascii() else c for c in text))


def _trim(s: Any) -> ct.StringType:
    return ct.StringType(_string(s, "trim").strip())


def _replace(s: Any, old: Any, new: Any, n: Any = -1) -> ct.StringType:
    return ct.StringType(_string(s, "replace").replace(str(old), str(new), int(n)))


def _split(s: Any, sep: Any, n: Any = -1) -> ct.ListType:
    text = _string(s, "split")
    limit = int(n)
    if limit == 0:
        return ct.ListType([])
    parts = text.split(str(sep), limit - 1 if limit > 0 else -1)
    return ct.ListType([ct.StringType(p) for p in parts])


def _join(items: Any, sep: Any = "") -> ct.StringType:
    return ct.StringType(str(sep).join(str(i) for i in items))


def _index_of(s: Any, sub: Any, start: Any = 0) -> ct.IntType:
    return ct.IntType(_string(s, "indexOf").find(str(sub), int(start)))


def _last_index_of(s: Any, sub: Any) -> ct.IntType:
    return ct.IntType(_string(s, "lastIndexOf").rfind(str(sub)))


def _substring(s: Any, start: Any, end: Any = None) -> ct.StringType:
    text = _string(s, "substring")
    stop = len(text) if end is None else int(end)
    if not 0 <= int(start) <= stop <= len(text):
        raise CelEvalError(f"substring({start}, {stop}) is out of range for {text!r}")
    return ct.StringType(text[int(start) : stop])


def _char_at(s: Any, i: Any) -> ct.StringType:
    text = _string(s, "charAt")
    if not 0 <= int(i) <= len(text):
        raise CelEvalError(f"charAt({i}) is out of range for {text!r}")
    return ct.StringType(text[int(i) : int(i) + 1])


def _number(value: Any) -> bool:
    return isinstance(value, ct.IntType | ct.UintType | ct.DoubleType)


def _plain(value: Any) -> int | float:
    return float(value) if isinstance(value, ct.DoubleType) else int(value)


def _is_null(value: Any) -> bool:
    return value is None or isinstance(value, ct.NullType)


def _equal(a: Any, b: Any) -> bool:
    """cel-go's ``==``, which the scheduler runs: values of different types are unequal (an
    int attribute compared with a string is false, not an error; a bool is never equal to a
    number), numbers compare by value across int, uint and double; only a quantity or
    semantic version compared with another type is an error (TypeError: no such overload)."""
    if _is_null(a) or _is_null(b):
        return _is_null(a) and _is_null(b)
    if isinstance(a, Quantity | Semver):
        if type(a) is not type(b):
            raise TypeError(f"no such overload: {type(a).__name__} == {type(b).__name__}")
        return bool(a == b)
    if isinstance(a, ct.BoolType) or isinstance(b, ct.BoolType):
        return isinstance(a, ct.BoolType) and isinstance(b, ct.BoolType) and bool(a) == bool(b)
    if _number(a) or _number(b):
        return _number(a) and _number(b) and _plain(a) == _plain(b)
    if isinstance(a, list) or isinstance(b, list):
        return (
            isinstance(a, list)
            and isinstance(b, list)
            and len(a) == len(b)
            and all(_equal(x, y) for x, y in zip(a, b, strict=True))
        )
    if isinstance(a, Mapping) or isinstance(b, Mapping):
        return (
            isinstance(a, Mapping)
            and isinstance(b, Mapping)
            and a.keys() == b.keys()
            and all(_equal(v, b[k]) for k, v in a.items())
        )
    if type(a) is not type(b) and not (isinstance(a, str) and isinstance(b, str)):
        return False
    try:
        return bool(a == b)
    except TypeError:
        return False


def _eq(a: Any, b: Any) -> Any:
    if isinstance(a, CelpyEvalError):
        return a
    if isinstance(b, CelpyEvalError):
        return b
    return ct.BoolType(_equal(a, b))


def _ne(a: Any, b: Any) -> Any:
    if isinstance(a, CelpyEvalError):
        return a
    if isinstance(b, CelpyEvalError):
        return b
    return ct.BoolType(not _equal(a, b))


def _contained(item: Any, value: Any) -> bool:
    try:
        return _equal(item, value)
    except TypeError:
        return False


def _in(item: Any, container: Any) -> Any:
    """``x in list`` tests each element with cel-go's ``==``, an element of another type
    being no match; maps keep cel-python's key lookup."""
    if isinstance(item, CelpyEvalError):
        return item
    if isinstance(container, CelpyEvalError):
        return container
    if isinstance(container, list):
        return ct.BoolType(any(_contained(item, x) for x in container))
    return celpy.evaluation.operator_in(item, container)


def _ordering(
    base: Callable[[Any, Any], Any], op: Callable[[Any, Any], bool]
) -> Callable[..., Any]:
    """``<`` and friends; numbers of different types compare by value, as with the
    scheduler's cross-type numeric comparisons (``numaNode < 1.5``)."""

    def compare(a: Any, b: Any) -> Any:
        if _number(a) and _number(b) and type(a) is not type(b):
            return ct.BoolType(op(_plain(a), _plain(b)))
        return base(a, b)

    return compare


OPERATORS: Mapping[str, Callable[..., Any]] = {
    "_==_": _eq,
    "_!=_": _ne,
    "_in_": _in,
    "_<_": _ordering(celpy.evaluation.bool_lt, operator.lt),
    "_<=_": _ordering(celpy.evaluation.bool_le, operator.le),
    "_>_": _ordering(celpy.evaluation.bool_gt, operator.gt),
    "_>=_": _ordering(celpy.evaluation.bool_ge, operator.ge),
}


FUNCTIONS: Mapping[str, Callable[..., Any]] = {
    "quantity": _quantity,
    "isQuantity": _is_quantity,
    "semver": _semver,
    "isSemver": _is_semver,
    "compareTo": _compare_to,
    "isGreaterThan": _greater,
    "isLessThan": _less,
    "add": _add,
    "sub": _sub,
    "sign": _sign,
    "isInteger": _is_integer,
    "asInteger": _as_integer,
    "asApproximateFloat": _as_float,
    "major": _version_part(0, "major"),
    "minor": _version_part(1, "minor"),
    "patch": _version_part(2, "patch"),
    "lowerAscii": _lower,
    "upperAscii": _upper,
    "trim": _trim,
    "replace": _replace,
    "split": _split,
    "join": _join,
    "indexOf": _index_of,
    "lastIndexOf": _last_index_of,
    "substring": _substring,
    "charAt": _char_at,
}
_KNOWN = (
    frozenset(FUNCTIONS)
    | frozenset(k for k in celpy.evaluation.base_functions if k.isidentifier())
    | frozenset({"has", "all", "exists", "exists_one", "map", "filter", "size"})
)


def _frozen(value: Any) -> Any:
    if isinstance(value, Mapping):
        return tuple(sorted((str(k), _frozen(v)) for k, v in value.items()))
    if isinstance(value, list | tuple):
        return tuple(_frozen(v) for v in value)
    return value


class _Domains(ct.MapType):
    """``device.attributes`` / ``device.capacity``: an unknown domain is an empty map."""

    def __getitem__(self, key: Any) -> Any:
        try:
            return super().__getitem__(key)
        except KeyError:
            return ct.MapType({})


@dataclass(frozen=True)
class DeviceData:
    """What a selector sees of one device: the API's ``attributes`` and ``capacity`` maps."""

    driver: str
    attributes: Mapping[str, Any]
    capacity: Mapping[str, Any]
    allow_multiple_allocations: bool = False


def _attribute_value(raw: Any) -> Any:
    if not isinstance(raw, Mapping):
        return ct.StringType(str(raw))
    if "string" in raw:
        return ct.StringType(raw["string"])
    if "bool" in raw:
        return ct.BoolType(bool(raw["bool"]))
    if "int" in raw:
        return ct.IntType(int(raw["int"]))
    if "version" in raw:
        try:
            return Semver(str(raw["version"]))
        except CelEvalError:
            return ct.StringType(str(raw["version"]))
    for key in ("strings", "ints", "bools", "versions"):
        if key in raw:
            return ct.ListType([_attribute_value({key[:-1]: v}) for v in raw[key]])
    return ct.StringType("")


def _split_name(name: str, driver: str) -> tuple[str, str]:
    if "/" in name:
        domain, _, ident = name.rpartition("/")
        return domain, ident
    return driver, name


def activation(device: DeviceData) -> dict[str, Any]:
    attrs: dict[str, dict[Any, Any]] = {}
    for name, raw in device.attributes.items():
        domain, ident = _split_name(name, device.driver)
        attrs.setdefault(domain, {})[ct.StringType(ident)] = _attribute_value(raw)
    caps: dict[str, dict[Any, Any]] = {}
    for name, raw in device.capacity.items():
        domain, ident = _split_name(name, device.driver)
        value = raw.get("value", "0") if isinstance(raw, Mapping) else raw
        caps.setdefault(domain, {})[ct.StringType(ident)] = _quantity(value)
    return {
        "device": ct.MapType(
            {
                ct.StringType("driver"): ct.StringType(device.driver),
                ct.StringType("attributes"): _Domains(
                    {ct.StringType(d): ct.MapType(v) for d, v in attrs.items()}
                ),
                ct.StringType("capacity"): _Domains(
                    {ct.StringType(d): ct.MapType(v) for d, v in caps.items()}
                ),
                ct.StringType("allowMultipleAllocations"): ct.BoolType(
                    device.allow_multiple_allocations
                ),
            }
        )
    }


_ENV = celpy.Environment()
_CALLS = re.compile(r"\.?\b([A-Za-z_][A-Za-z0-9_]*)\s*\(")


_MACROS = re.compile(r"\.\s*(exists|exists_one|all|map|filter)\s*\(")


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
    parse or calls a function the Kubernetes CEL environment does not have."""
    try:
        ast = _ENV.compile(expression)
    except (CELParseError, lark.exceptions.LarkError) as e:
        line, column = getattr(e, "line", None), getattr(e, "column", None)
        if isinstance(line, int) and isinstance(column, int) and column > 0:
            text = expression.splitlines()[line - 1] if expression.splitlines() else ""
            where = f" (line {line}, column {column})\n    {text}\n    {' ' * (column - 1)}^"
        else:
            where = f": {str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__}"
        raise CelSyntaxError(f"CEL expression does not parse{where}") from e
    for name in _CALLS.findall(_strip_strings(expression)):
        if name not in _KNOWN:
            raise CelSyntaxError(f"CEL expression calls an undeclared function {name!r}")
    program = _ENV.program(ast, functions={**FUNCTIONS, **OPERATORS})
    return Selector(expression, program)


_STRING = re.compile(r"\"(?:[^\"\\]|\\.)*\"|'(?:[^'\\]|\\.)*'")


def _strip_strings(expression: str) -> str:
    return _STRING.sub('""', expression)
