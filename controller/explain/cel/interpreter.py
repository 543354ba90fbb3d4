"""cel-python's interpreter with cel-go's optional library on top (values in ``optional.py``).

- ``member_opt_dot`` / ``member_opt_index`` (``m.?f``, ``m[?k]``) give an optional.
- Selecting or indexing an optional (``m.?a.b``, ``optional.of(m)["k"]``) qualifies inside
  it with a presence test, as cel-go does for every qualifier after an optional one.
- ``or`` and ``orValue`` evaluate their argument only when the optional is empty, so an
  error there does not matter when a value is present (cel-go short-circuits them).
- ``cel.bind(name, value, expr)`` (cel-go's ``ext.Bindings``, in the DRA selector
  environment) evaluates ``expr`` with ``name`` bound to ``value``.
- ``optMap(v, expr)`` and ``optFlatMap(v, expr)`` are macros; ``optional.of(...)`` and its
  siblings are calls into the ``optional`` namespace.
- ``[?x]`` and ``{?k: x}`` (``opt_elem``) add x's value when present, nothing when not; as in
  cel-go, a map literal's repeated key keeps its last value.
- An error inside a macro's expression is an error value, as every other error, never an
  exception that would end the evaluation (cel-python raises them), so ``||`` can absorb it.
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
_MACROS = frozenset({"map", "filter", "all", "exists", "exists_one"})


def bare_name(tree: Any) -> str | None:
    """The name ``tree`` is when it is a bare name (``optional`` in ``optional.of(1)``, ``a``
    in ``cel.bind(a, ...)``), else None."""
    while isinstance(tree, lark.Tree) and len(tree.children) == 1:
        if tree.data == "ident":
            token = tree.children[0]
            return token.value if isinstance(token, lark.Token) else None
        if tree.data not in WRAPPERS:
            return None
        tree = tree.children[0]
    return None


# nodes that stand for their only child; cel-go's parser keeps no trace of them
WRAPPERS = frozenset(
    {"expr", "conditionalor", "conditionaland", "relation", "addition", "multiplication"}
    | {"unary", "member", "primary", "paren_expr"}
)


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
        receiver = bare_name(tree.children[0])
        if receiver == "optional":
            args = self.visit(tree.children[2]) if len(tree.children) > 2 else []
            token = lark.Token("IDENT", f"optional.{name}")
            return self.function_eval(token, args)
        if receiver == "cel" and name == "bind":
            return self._bind(tree)
        if name in _MACROS:
            try:
                return super().member_dot_arg(tree)
            except CelpyEvalError as e:  # cel-python's map and filter raise their errors
                return e
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
        try:
            result = self.build_macro_eval(tree)(member.value)
        except CelpyEvalError as e:
            return e
        if name == "optMap":
            return CelOptional(result)
        if isinstance(result, CelOptional):
            return result
        return CelpyEvalError(f"no such overload: optFlatMap needs an optional, not {result!r}")

    def _bind(self, tree: Tree) -> Any:
        """``cel.bind(name, value, expr)``: ``expr`` with ``name`` standing for ``value``. An
        error value bound is an error only where ``expr`` uses it, as in cel-go, which
        evaluates the value lazily."""
        name_node, value_node, expr_node = tree.children[2].children  # checked when compiled
        value = self.visit(value_node)
        try:
            return self.sub_evaluator(expr_node).evaluate({str(bare_name(name_node)): value})
        except CelpyEvalError as e:
            return e

    def _element(self, node: Any) -> tuple[Any, bool]:
        """A list element or map key: its value, and whether it is an optional one (``?x``)."""
        if isinstance(node, lark.Tree) and node.data == "opt_elem":
            return self.visit(node.children[0]), True
        return self.visit(node), False

    def listinit(self, tree: Tree) -> Any:
        items = []
        for node in tree.children:
            value, optional = self._element(node)
            if optional:
                value, present = _unwrapped(value, "[?x]")
                if not present:
                    continue
            if isinstance(value, CelpyEvalError):
                return value
            items.append(value)
        return celpy.celtypes.ListType(items)

    def mapinits(self, tree: Tree) -> Any:
        result = celpy.celtypes.MapType()
        for key_node, value_node in zip(tree.children[0::2], tree.children[1::2], strict=True):
            key, optional = self._element(key_node)
            if isinstance(key, CelpyEvalError):
                return key
            value = self.visit(value_node)
            if optional:
                value, present = _unwrapped(value, "{?k: x}")
                if not present:
                    continue
            if isinstance(value, CelpyEvalError):
                return value
            if not celpy.celtypes.MapType.valid_key_type(key):
                return CelpyEvalError(f"unsupported map key type: {type(key).__name__}")
            result[key] = value  # a repeated key keeps its last value, as in cel-go
        return result


def _unwrapped(value: Any, where: str) -> tuple[Any, bool]:
    """An optional element's value and whether it is present; an error value (present, so
    that it is reported) when ``value`` is an error or no optional."""
    if isinstance(value, CelpyEvalError):
        return value, True
    if not isinstance(value, CelOptional):
        return CelpyEvalError(f"no such overload: {where} needs an optional, not {value!r}"), True
    return value.value, value.present


class OptionalRunner(celpy.InterpretedRunner):
    """The interpreting runner, with :class:`OptionalEvaluator`."""

    def evaluate(self, context: Any) -> Any:
        return OptionalEvaluator(ast=self.ast, activation=self.new_activation()).evaluate(context)
