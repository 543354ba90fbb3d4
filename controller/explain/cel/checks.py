"""What cel-go's compiler refuses that cel-python's parser takes, checked on the parsed
expression (:func:`check`): ``has()`` on anything but a field selection, a ``cel.bind()``
that is not a name, a value and an expression, and calls to functions the Kubernetes CEL
environment does not declare."""

from __future__ import annotations

import re
from typing import Any

import celpy
import lark

from controller.explain.cel import extensions
from controller.explain.cel.interpreter import WRAPPERS, bare_name
from controller.explain.cel.library import FUNCTIONS
from controller.explain.cel.optional import OPTIONAL_CALLS
from controller.explain.cel.values import CelSyntaxError

Tree = lark.Tree[Any]

_KNOWN = (
    frozenset(FUNCTIONS)
    | frozenset(k for k in celpy.evaluation.base_functions if k.isidentifier())
    | frozenset({"has", "dyn", "all", "exists", "exists_one", "map", "filter", "size"})
    | OPTIONAL_CALLS
    | extensions.KNOWN_CALLS
)
_CALLS = re.compile(r"\.?\b([A-Za-z_][A-Za-z0-9_]*)\s*\(")
_CEL_BIND = re.compile(r"\bcel\s*\.\s*bind\s*\(")
_STRING = re.compile(r"\"(?:[^\"\\]|\\.)*\"|'(?:[^'\\]|\\.)*'")


def where(expression: str, line: int, column: int) -> str:
    """`` (line L, column C)`` and the line with a caret under the column."""
    lines = expression.splitlines()
    text = lines[line - 1] if 0 < line <= len(lines) else ""
    return f" (line {line}, column {column})\n    {text}\n    {' ' * (column - 1)}^"


def _invalid_has(ast: Tree) -> Tree | None:
    """The argument of a ``has(...)`` that is no plain field selection ``e.f``: an optional
    one (``e.?f``), an index (``e["f"]``), a name."""
    for node in ast.find_data("ident_arg"):
        if str(node.children[0]) != "has":
            continue
        args = node.children[1].children if len(node.children) > 1 else []
        given: Tree = args[0] if len(args) == 1 else node
        arg: Any = given
        while isinstance(arg, lark.Tree) and arg.data in WRAPPERS and len(arg.children) == 1:
            arg = arg.children[0]
        if not (isinstance(arg, lark.Tree) and arg.data == "member_dot"):
            return given
    return None


def _invalid_bind(ast: Tree) -> tuple[Tree, str] | None:
    """A ``cel.bind(...)`` that cel-go refuses, with its message."""
    for node in ast.find_data("member_dot_arg"):
        if str(node.children[1]) != "bind" or bare_name(node.children[0]) != "cel":
            continue
        args = node.children[2].children if len(node.children) > 2 else []
        if len(args) != 3:
            return node, "cel.bind() takes a name, a value and an expression"
        if bare_name(args[0]) is None:
            return args[0], "cel.bind() variable names must be simple identifiers"
    return None


def check(expression: str, ast: Tree) -> None:
    """:class:`CelSyntaxError` when cel-go would not compile the parsed ``expression``."""
    bad_has = _invalid_has(ast)
    if bad_has is not None:
        at = where(expression, bad_has.meta.line, bad_has.meta.column)
        raise CelSyntaxError(f"CEL expression has an invalid argument to has() macro{at}")
    bad_bind = _invalid_bind(ast)
    if bad_bind is not None:
        node, message = bad_bind
        at = where(expression, node.meta.line, node.meta.column)
        raise CelSyntaxError(f"CEL expression does not compile: {message}{at}")
    for name in _CALLS.findall(_CEL_BIND.sub("(", _STRING.sub('""', expression))):
        if name not in _KNOWN:
            raise CelSyntaxError(f"CEL expression calls an undeclared function {name!r}")
