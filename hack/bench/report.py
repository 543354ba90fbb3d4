"""Results as a console table and as the Markdown blocks of ``docs/performance.md``.

Each scenario owns one block of the document, between ``<!-- bench:NAME -->`` and
``<!-- /bench:NAME -->``; a run rewrites only the blocks of the scenarios it ran,
so the prose around them (the analysis) stays as written.
"""

from __future__ import annotations

import re
from pathlib import Path

from hack.bench.results import Row, ScenarioResult


def _verdict(row: Row) -> str:
    if row.met is None:
        return ""
    return "met" if row.met else "**missed**"


def _cells(row: Row) -> list[str]:
    return [row.metric, row.value, "" if row.samples is None else str(row.samples), row.target]


def console(result: ScenarioResult) -> str:
    header = ["metric", "value", "n", "target", ""]
    body = [[*_cells(r), _verdict(r).strip("*")] for r in result.rows]
    widths = [max(len(line[i]) for line in [header, *body]) for i in range(len(header))]
    lines = [f"== {result.title}"]
    lines += [
        "  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)) for line in [header, *body]
    ]
    lines += [f"note: {n}" for n in result.notes]
    return "\n".join(lines)


def markdown(result: ScenarioResult, command: str, machine: str) -> str:
    lines = [f"Measured by `{command}` on {machine}.", ""]
    lines += [*result.setup, ""] if result.setup else []
    lines += ["| Metric | Value | Samples | Target | |", "| --- | --- | --- | --- | --- |"]
    for row in result.rows:
        cells = [c.replace("|", "\\|") for c in _cells(row)]
        lines.append("| " + " | ".join([*cells, _verdict(row)]) + " |")
    if result.notes:
        lines.append("")
        lines += [f"- {n}" for n in result.notes]
    return "\n".join(lines)


def update_document(path: Path, blocks: dict[str, str]) -> list[str]:
    """Replace each named block of ``path``; a block not yet there is appended. Names written."""
    text = path.read_text() if path.exists() else "# Performance\n"
    for name, body in blocks.items():
        begin, end = f"<!-- bench:{name} -->", f"<!-- /bench:{name} -->"
        replacement = f"{begin}\n{body}\n{end}"
        found = re.search(re.escape(begin) + r".*?" + re.escape(end), text, re.DOTALL)
        if found:
            text = text[: found.start()] + replacement + text[found.end() :]
        else:
            text = text.rstrip("\n") + f"\n\n{replacement}\n"
    path.write_text(text)
    return list(blocks)
