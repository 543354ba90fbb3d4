"""cel-python's parser with cel-go's optional syntax added: selection ``member.?field`` and
``member[?index]`` (rules ``member_opt_dot`` and ``member_opt_index``) and list and map
elements ``[?x]`` and ``{?k: x}`` (rules ``listinit``, ``mapinits`` and ``opt_elem``), all
evaluated by ``interpreter.py``; lists and maps may end in a comma, as in cel-go."""

from __future__ import annotations

import re
from pathlib import Path

import celpy
import lark
from celpy.celparser import CELParseError, CELParser
from lark.exceptions import LexError, ParseError, UnexpectedCharacters, UnexpectedToken

_MEMBER = "member         : member_dot | member_dot_arg | member_index | member_object | primary"
_OPTIONAL_MEMBER = """member         : member_dot | member_dot_arg | member_index | member_object
               | member_opt_dot | member_opt_index | primary
member_opt_dot : member "." "?" IDENT
member_opt_index : member "[" "?" expr "]"
"""


_LITERALS = {
    'list_lit       : "[" [exprlist] "]"': 'list_lit       : "[" [listinit] "]"',
    'mapinits       : expr ":" expr ("," expr ":" expr)*': """
listinit       : (expr | opt_elem) ("," (expr | opt_elem))* [","]
mapinits       : (expr | opt_elem) ":" expr ("," (expr | opt_elem) ":" expr)* [","]
opt_elem       : "?" expr
""",
}


def _grammar() -> str:
    text = (Path(celpy.__file__).parent / "cel.lark").read_text()
    for old, new in {_MEMBER: _OPTIONAL_MEMBER, **_LITERALS}.items():
        if old not in text:
            raise RuntimeError(f"cel-python's grammar changed: no rule {old.split()[0]!r}")
        text = text.replace(old, new)
    return text


_LARK = lark.Lark(
    _grammar(),
    parser="lalr",
    start="expr",
    g_regex_flags=re.M,
    lexer_callbacks={"IDENT": CELParser.ambiguous_literals},
    propagate_positions=True,
    maybe_placeholders=False,
    priority="invert",
)


class OptionalSyntaxParser(CELParser):
    """A :class:`CELParser` over the grammar with optional selection."""

    def __init__(self) -> None:
        self.text = ""

    def parse(self, text: str) -> lark.Tree[lark.Token]:
        self.text = text
        try:
            return _LARK.parse(text)
        except (UnexpectedToken, UnexpectedCharacters) as ex:
            raise CELParseError(
                ex.get_context(text), *ex.args, line=ex.line, column=ex.column
            ) from ex
        except (LexError, ParseError) as ex:
            raise CELParseError(ex.args[0].splitlines()[0], *ex.args) from ex


def environment(runner: type[celpy.Runner]) -> celpy.Environment:
    """A cel-python environment with ``runner`` that parses the optional syntax.
    ``celpy.Environment`` builds cel-python's own parser when none exists yet (a quarter
    second at every start of the command); lending it ours while it is built skips that,
    and cel-python's slot is left as it was."""
    saved = CELParser.CEL_PARSER
    CELParser.CEL_PARSER = saved or _LARK
    try:
        env = celpy.Environment(runner_class=runner)
    finally:
        CELParser.CEL_PARSER = saved
    env.cel_parser = OptionalSyntaxParser()
    return env
