"""cel-python's parser with cel-go's optional selection added: ``member.?field`` and
``member[?index]`` (rules ``member_opt_dot`` and ``member_opt_index``, evaluated by
``interpreter.py``). Optional list and map elements (``[?x]``, ``{?k: v}``) stay
unparsed; :func:`unsupported` names them so the error says explain cannot evaluate them."""

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


def _grammar() -> str:
    text = (Path(celpy.__file__).parent / "cel.lark").read_text()
    if _MEMBER not in text:
        raise RuntimeError("cel-python's grammar changed: its member rule is not where expected")
    return text.replace(_MEMBER, _OPTIONAL_MEMBER)


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


# "[?" opening a list (a "[" after no operand), "{?" opening a map, ", ?" inside either
_OPTIONAL_ELEMENT = re.compile(r"(?:(?<![\w\])}\"'\s])\s*\[|\{|,)\s*\?")


def unsupported(stripped: str) -> str | None:
    """What of ``stripped`` (the expression with its strings emptied) explain cannot
    evaluate though the scheduler can, or None."""
    if _OPTIONAL_ELEMENT.search(stripped):
        return "optional list or map elements ([?x], {?k: v})"
    return None
