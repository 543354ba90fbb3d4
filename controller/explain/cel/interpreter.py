"""cel-python's interpreter with cel-go's optional library on top (values in ``optional.py``).

- ``member_opt_dot`` / ``member_opt_index`` (``m.?f``, ``m[?k]``) give an optional.
- Selecting or indexing an optional (``m.?a.b``, ``optional.of(m)["k"]``) qualifies inside
  it with a presence test, as cel-go does for every qualifier after an optional one.
- ``or`` and ``orValue`` evaluate their argument only when the optional is empty, so an
  error there does not matter when a value is present (cel-go short-circuits them).
- ``optMap(v, expr)`` and ``optFlatMap(v, expr)`` are macros; ``optional.of(...)`` and its
  siblings are calls into the ``optional`` namespace.
- ``extensions.py`` evaluates the other libraries' namespaced calls (``sets.contains``),
  two-variable comprehensions and ``sortBy``.
Everything else is cel-python's :class:`~celpy.evaluation.Evaluator`, each node evaluated once.
"""

from __future__ import annotations

from typing import Any

import celpy
import lark
from celpy.evaluation import CELEvalError as CelpyEvalError
from celpy.evaluation import Evaluator

from controller.explain.cel import extensions
from controller.explain.cel.optional import NONE, CelOptional, qualify

Tree = lark.Tree[Any]
_LAZY = frozenset({"or", "orValue", "optMap", "optFlatMap"})


def _namespace(tree: Any) -> bool:
    """Whether ``tree`` is the bare name ``optional`` (as in ``optional.of(1)``)."""
    while isinstance(tree, lark.Tree) and tree.data in {"member", "primary", "ident"}:
        if tree.data == "ident":
            token = tree.children[0]
            return isinstance(token, lark.Token) and token.value == "optional"
        if len(tree.children) != 1:
            return False
        tree = tree.children[0]
    return False


def _name(tree: Tree) -> str:
    """The field or method name of a ``member.name`` node."""
    return str(tree.children[1])


class OptionalEvaluator(Evaluator):
    """An :class:`Evaluator` that knows optional values."""

    def sub_evaluator(self, ast: Tree) -> Evaluator:
        return type(self)(ast, activation=self.activation)

    def evaluated(self, tree: Tree) -> Any:
        """A node standing for a value already computed (see :meth:`_with_member`)."""
        return tree.children[0]

    def _with_member(self, tree: Tree, member: Any) -> Tree:
        children = [lark.Tree("evaluated", [member]), *tree.children[1:]]
        return lark.Tree(tree.data, children, meta=tree.meta)

    def member_opt_dot(self, tree: Tree) -> Any:
        member = self.visit(tree.children[0])
        return qualify(member, celpy.celtypes.StringType(_name(tree)))

    def member_opt_index(self, tree: Tree) -> Any:
        member, index = self.visit(tree.children[0]), self.visit(tree.children[1])
        if isinstance(index, CelpyEvalError):
            return index
        return qualify(member, index)

    def member_dot(self, tree: Tree) -> Any:
        member = self.visit(tree.children[0])
        if isinstance(member, CelOptional):
            return qualify(member, celpy.celtypes.StringType(_name(tree)))
        return super().member_dot(self._with_member(tree, member))

    def member_index(self, tree: Tree) -> Any:
        member = self.visit(tree.children[0])
        if isinstance(member, CelOptional):
            return self.member_opt_index(self._with_member(tree, member))
        return super().member_index(self._with_member(tree, member))

    def member_dot_arg(self, tree: Tree) -> Any:
        handled = extensions.member_call(self, tree)
        if handled is not extensions.UNHANDLED:
            return handled
        name = _name(tree)
        if _namespace(tree.children[0]):
            args = self.visit(tree.children[2]) if len(tree.children) > 2 else []
            token = lark.Token("IDENT", f"optional.{name}")
            return self.function_eval(token, args)
        if name not in _LAZY:
            return super().member_dot_arg(tree)
        member = self.visit(tree.children[0])
        if isinstance(member, CelpyEvalError):
            return member
        if not isinstance(member, CelOptional):
            return CelpyEvalError(f"no such overload: {name} needs an optional")
        if name in {"or", "orValue"}:
            if member.present:
                return member if name == "or" else member.value
            return super().member_dot_arg(self._with_member(tree, member))
        if not member.present:
            return NONE
        result = self.build_macro_eval(tree)(member.value)
        if isinstance(result, CelpyEvalError):
            return result
        if name == "optMap":
            return CelOptional(result)
        if isinstance(result, CelOptional):
            return result
        return CelpyEvalError(f"no such overload: optFlatMap needs an optional, not {result!r}")


class OptionalRunner(celpy.InterpretedRunner):
    """The interpreting runner, with :class:`OptionalEvaluator`."""

    def evaluate(self, context: Any) -> Any:
        return OptionalEvaluator(ast=self.ast, activation=self.new_activation()).evaluate(context)
