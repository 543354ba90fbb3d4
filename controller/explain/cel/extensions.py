"""The CEL libraries of the DRA selector environment beyond quantities, semantic versions and
the strings basics (``library.py``), put together: :data:`FUNCTIONS` (sets, lists, format and
``strings.quote``, IP and CIDR, regex ``find``), :func:`member_call` for what the interpreter
must evaluate itself (namespaced calls such as ``sets.contains(a, b)``, two-variable
comprehensions, ``sortBy``, the three-argument ``map``, the quantifiers ``all``, ``exists``
and ``exists_one``, ``min`` which cel-python takes for a macro), and :func:`check`,
which refuses at compile time what cel-go refuses (``q.sign()``, a two-variable comprehension
without two names) and what explain cannot evaluate (the URL and format libraries), with a
message saying so rather than a wrong verdict.

Which libraries the scheduler has: k8s.io/apiserver/pkg/cel/environment/base.go (v0.37.2)
enables ext.Strings v2, ext.Sets, ext.TwoVarComprehensions, ext.Lists v3, optional types, and
Kubernetes' URLs, Regex, Quantity, IP, CIDR, Format, Semver v1 and Lists v1; the DRA
compiler adds ext.Bindings (``cel.bind``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import lark
from celpy.evaluation import CELEvalError as CelpyEvalError

from controller.explain.cel import (
    comprehensions,
    lib_format,
    lib_lists,
    lib_net,
    lib_regex,
    lib_sets,
)
from controller.explain.cel.library import FUNCTIONS as BASICS
from controller.explain.cel.values import CelSyntaxError

Tree = lark.Tree[Any]


def _by_receiver(on_list: Callable[..., Any], other: Callable[..., Any]) -> Callable[..., Any]:
    """One name, two libraries: the list function for a list receiver, else ``other``."""

    def call(receiver: Any, *args: Any) -> Any:
        return (on_list if isinstance(receiver, list) else other)(receiver, *args)

    return call


FUNCTIONS: Mapping[str, Callable[..., Any]] = {
    **lib_sets.FUNCTIONS,
    **lib_lists.FUNCTIONS,
    **lib_format.FUNCTIONS,
    **lib_net.FUNCTIONS,
    **lib_regex.FUNCTIONS,
    "indexOf": _by_receiver(lib_lists.FUNCTIONS["indexOf"], BASICS["indexOf"]),
    "lastIndexOf": _by_receiver(lib_lists.FUNCTIONS["lastIndexOf"], BASICS["lastIndexOf"]),
}
"""Registered after ``library.FUNCTIONS``: ``indexOf`` and ``lastIndexOf`` dispatch here."""

_NAMESPACES = frozenset(name.split(".")[0] for name in FUNCTIONS if "." in name)

# Declared by the scheduler's environment, not evaluated here: name -> its library
_NOT_EVALUATED = {
    **dict.fromkeys(
        ("url", "isURL", "getScheme", "getHost", "getHostname", "getPort", "getEscapedPath"),
        "URL",
    ),
    "getQuery": "URL",
    "validate": "format",
}

# Kubernetes' format library: format.named(name), format.<name>(), then .validate(s)
_FORMATS = frozenset(
    {"named", "dns1123Label", "dns1123Subdomain", "dns1035Label", "qualifiedName"}
    | {"dns1123LabelPrefix", "dns1123SubdomainPrefix", "dns1035LabelPrefix", "labelValue"}
    | {"uri", "uuid", "byte", "date", "datetime"}
)

KNOWN_CALLS = (
    frozenset(name.rsplit(".", 1)[-1] for name in FUNCTIONS)
    | frozenset(comprehensions.TWO_VARIABLE)
    | frozenset({"sortBy"})
    | frozenset(_NOT_EVALUATED)
    | _FORMATS
)
"""The function and macro names these libraries add, for the undeclared-function check."""

# Kubernetes declares these only as functions, f(x), or only as methods, x.f(): cel-go
# refuses the other form when it compiles the selector.
_FUNCTION_ONLY = frozenset(
    {"quantity", "isQuantity", "sign", "semver", "isSemver", "cidr", "isIP", "isCIDR"}
)
_METHOD_ONLY = frozenset(
    {"compareTo", "isGreaterThan", "isLessThan", "add", "sub", "isInteger", "asInteger"}
    | {"asApproximateFloat", "major", "minor", "patch", "format", "family", "masked"}
    | {"isUnspecified", "isLoopback", "isLinkLocalMulticast", "isLinkLocalUnicast"}
    | {"isGlobalUnicast", "containsIP", "containsCIDR", "prefixLength", "find", "findAll"}
    | {"sum", "max", "min", "isSorted", "includes", "slice", "flatten", "sort", "distinct"}
    | {"reverse"}
)


def _bare_name(tree: Any) -> str | None:
    """The name ``tree`` is when it is a bare name (``sets`` in ``sets.contains(a, b)``)."""
    while isinstance(tree, lark.Tree) and len(tree.children) == 1:
        if tree.data == "ident":
            token = tree.children[0]
            return token.value if isinstance(token, lark.Token) else None
        tree = tree.children[0]
    return None


def _args(tree: Tree) -> list[Any]:
    return list(tree.children[2].children) if len(tree.children) > 2 else []


def _two_names(tree: Tree) -> tuple[str, str] | None:
    """The variable names of a two-variable comprehension ``tree``, else None."""
    args = _args(tree)
    if len(args) not in comprehensions.TWO_VARIABLE.get(str(tree.children[1]), ()):
        return None
    first, second = _bare_name(args[0]), _bare_name(args[1])
    return (first, second) if first is not None and second is not None else None


UNHANDLED = object()


def member_call(evaluator: Any, tree: Tree) -> Any:
    """``member.name(args)`` when this module evaluates it (else :data:`UNHANDLED`)."""
    name = str(tree.children[1])
    namespace = _bare_name(tree.children[0])
    if namespace in _NAMESPACES and f"{namespace}.{name}" in FUNCTIONS:
        values = [evaluator.visit(arg) for arg in _args(tree)]
        return evaluator.function_eval(lark.Token("IDENT", f"{namespace}.{name}"), values)
    names = _two_names(tree)
    if names is not None:
        return comprehensions.two_variable(evaluator, tree, names)
    if name == "sortBy":
        return comprehensions.sort_by(evaluator, tree, str(_bare_name(_args(tree)[0])))
    args = _args(tree)
    variable = _bare_name(args[0]) if args else None
    if name == "map" and len(args) == 3 and variable is not None:
        return comprehensions.map_filtered(evaluator, tree, variable)
    if name in comprehensions.ONE_VARIABLE and len(args) == 2 and variable is not None:
        return comprehensions.one_variable(evaluator, tree, variable)
    if name in {"min", "max"}:  # cel-python's own "min" macro is no list function
        receiver = evaluator.visit(tree.children[0])
        if isinstance(receiver, CelpyEvalError):
            return receiver
        return evaluator.function_eval(lark.Token("IDENT", name), [receiver])
    return UNHANDLED


def _refusal(tree: Tree) -> str | None:
    """Why cel-go or explain refuses the call ``tree`` (``ident_arg`` or ``member_dot_arg``)."""
    if tree.data == "ident_arg":
        name = str(tree.children[0])
        if name in _METHOD_ONLY:
            return f"calls {name}(...) as a function: the scheduler declares only x.{name}(...)"
        if name in _NOT_EVALUATED:
            return f"explain cannot evaluate CEL's {_NOT_EVALUATED[name]} library ({name}())"
        return None
    name, namespace = str(tree.children[1]), _bare_name(tree.children[0])
    if namespace == "format" and name in _FORMATS:
        return f"explain cannot evaluate CEL's format library (format.{name}())"
    if namespace in _NAMESPACES and f"{namespace}.{name}" in FUNCTIONS:
        return None
    if name in _FUNCTION_ONLY:
        return f"calls x.{name}() as a method: the scheduler declares only {name}(x)"
    if name in _NOT_EVALUATED:
        return f"explain cannot evaluate CEL's {_NOT_EVALUATED[name]} library ({name}())"
    args, counts = _args(tree), comprehensions.TWO_VARIABLE.get(name)
    if counts is not None and len(args) in counts:
        names = _two_names(tree)
        if names is None:
            return f"{name}(): the first two arguments must be simple names"
        if names[0] == names[1]:
            return f"{name}(): duplicate variable name: {names[0]}"
    elif counts is not None and name not in {"all", "exists", "exists_one"}:
        return f"{name}() takes {' or '.join(map(str, counts))} arguments, not {len(args)}"
    if name == "sortBy" and (len(args) != 2 or _bare_name(args[0]) is None):
        return "sortBy() takes a simple name and a key expression"
    return None


def check(ast: Tree) -> None:
    """:class:`CelSyntaxError` for the first call of ``ast`` cel-go would refuse to compile
    or explain cannot evaluate."""
    for node in ast.iter_subtrees():
        if node.data not in {"ident_arg", "member_dot_arg"}:
            continue
        why = _refusal(node)
        if why is None:
            continue
        where = f" (line {node.meta.line}, column {node.meta.column})"
        if why.startswith("explain cannot evaluate"):
            raise CelSyntaxError(f"{why}, which the scheduler accepts{where}")
        raise CelSyntaxError(f"CEL expression does not compile: {why}{where}")
