"""The user docs and the Helm chart stay true to the code: every plugin and controller flag
documented with its environment twin and default, every command with an example, every
fault point listed, every doc linked from the README, and the chart setting only
environment variables the processes read."""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Callable
from pathlib import Path

import pytest

from controller import settings as controller_settings
from driver.cli import load_commands
from driver.cli.sim import sim_command
from driver.faults import POINTS
from driver.flags import env_name
from kubelet_plugin import settings as plugin_settings

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"
CHART = REPO / "deploy" / "helm" / "tranche" / "templates"
BEGIN, END = "<!-- flags:begin -->", "<!-- flags:end -->"


def parser_of(
    add_arguments: Callable[[argparse.ArgumentParser], None], monkeypatch: pytest.MonkeyPatch
) -> argparse.ArgumentParser:
    """The command's parser with the built-in defaults (no TRANCHE_* variable set)."""
    for name in [n for n in os.environ if n.startswith("TRANCHE_")]:
        monkeypatch.delenv(name)
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser


def flag_table(parser: argparse.ArgumentParser) -> str:
    """The Markdown table docs/kubelet-plugin.md and docs/controller.md carry between their
    flags markers."""
    rows = ["| Flag | Environment | Default | Meaning |", "| --- | --- | --- | --- |"]
    for action in parser._actions:
        if not action.option_strings or action.dest == "help":
            continue
        flag = action.option_strings[0]
        meaning = re.sub(r" \[env [A-Z_]+\].*$", "", action.help or "")
        if action.choices:
            meaning += "; one of " + ", ".join(f"`{c}`" for c in action.choices)
        if isinstance(action, argparse.BooleanOptionalAction):
            name, default = f"`--[no-]{flag[2:]}`", "on" if action.default else "off"
        else:
            name = f"`{flag}`"
            default = f"`{action.default}`" if action.default not in (None, "") else "—"
        meaning = meaning.replace("|", "\\|").replace("<", "&lt;")
        rows.append(f"| {name} | `{env_name(flag)}` | {default} | {meaning} |")
    return "\n".join(rows)


def env_twins(add_arguments: Callable[[argparse.ArgumentParser], None]) -> set[str]:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return {env_name(a.option_strings[0]) for a in parser._actions if a.dest != "help"}


@pytest.mark.parametrize(
    ("doc", "add_arguments"),
    [
        ("kubelet-plugin.md", plugin_settings.add_arguments),
        ("controller.md", controller_settings.add_arguments),
    ],
)
def test_every_flag_is_documented_with_its_twin_and_default(
    doc: str,
    add_arguments: Callable[[argparse.ArgumentParser], None],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    text = (DOCS / doc).read_text()
    documented = text[text.index(BEGIN) + len(BEGIN) : text.index(END)].strip()
    expected = flag_table(parser_of(add_arguments, monkeypatch))
    assert documented == expected, (
        f"docs/{doc} is out of date; put this between {BEGIN} and {END}:\n\n{expected}\n"
    )


def test_every_command_is_documented_with_an_example() -> None:
    """docs/controller.md shows every command but the two processes with one example."""
    text = (DOCS / "controller.md").read_text()
    commands = set(load_commands()) - {"kubelet-plugin", "controller"}
    missing = [c for c in sorted(commands) if f"`tranche {c} " not in text]
    assert missing == []


def test_every_sim_action_is_listed_and_shown() -> None:
    """docs/controller.md's row of ``tranche sim`` names every action, and docs/simulation.md
    shows each with a command line."""
    parser = argparse.ArgumentParser()
    sim_command.add_arguments(parser)
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    (row,) = [
        r for r in (DOCS / "controller.md").read_text().splitlines() if "| `tranche sim`" in r
    ]
    shown = (DOCS / "simulation.md").read_text()
    assert [a for a in sub.choices if f"`{a}`" not in row] == []
    assert [a for a in sub.choices if f"tranche sim {a} " not in shown] == []


def test_every_fault_point_is_listed_in_the_checkpoint_doc() -> None:
    text = (DOCS / "checkpoint.md").read_text()
    listed = set(re.findall(r"^\| `([a-z-]+:[a-z-]+)` \|", text, flags=re.MULTILINE))
    assert listed == set(POINTS)


def test_the_readme_links_every_doc() -> None:
    readme = (REPO / "README.md").read_text()
    missing = [p.name for p in sorted(DOCS.glob("*.md")) if f"(docs/{p.name})" not in readme]
    assert missing == []


@pytest.mark.parametrize(
    ("template", "add_arguments", "other"),
    [
        ("kubelet-plugin-daemonset.yaml", plugin_settings.add_arguments, set()),
        ("controller.yaml", controller_settings.add_arguments, {"POD_NAME"}),
    ],
)
def test_the_chart_sets_only_variables_the_process_reads(
    template: str,
    add_arguments: Callable[[argparse.ArgumentParser], None],
    other: set[str],
) -> None:
    text = (CHART / template).read_text()
    set_by_chart = set(re.findall(r"name: ([A-Z][A-Z0-9_]+)", text)) - {"LD_LIBRARY_PATH"}
    assert set_by_chart - env_twins(add_arguments) == other


_FENCE = re.compile(r"^(```|~~~)")
_HEADING = re.compile(r"^(#{1,6}) +(.*?) *#*$")
_LINK = re.compile(r"\]\(([^)\s]+)\)")


def _prose(path: Path) -> list[tuple[int, str]]:
    """The numbered lines of ``path`` outside fenced code blocks."""
    out, fenced = [], False
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if _FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            out.append((number, line))
    return out


def heading_anchors(path: Path) -> set[str]:
    """The anchors GitHub gives the headings of ``path``: lower case, punctuation dropped,
    spaces as hyphens, and ``-1``, ``-2`` … after a repeated one."""
    seen: dict[str, int] = {}
    found: set[str] = set()
    for _, line in _prose(path):
        if m := _HEADING.match(line):
            text = re.sub(r"<[^>]+>", "", m.group(2)).strip().lower()
            slug = re.sub(r"[^\w\- ]", "", text).replace(" ", "-")
            n = seen.get(slug, 0)
            seen[slug] = n + 1
            found.add(f"{slug}-{n}" if n else slug)
    return found


def test_every_link_between_docs_names_a_file_and_a_heading_it_has() -> None:
    """A section moved or renamed leaves no link to it behind (README.md and docs/)."""
    anchors: dict[Path, set[str]] = {}
    broken = []
    for doc in [REPO / "README.md", *sorted(DOCS.glob("*.md"))]:
        for number, line in _prose(doc):
            for target in _LINK.findall(line):
                if re.match(r"^[a-z]+:", target):
                    continue  # https:, mailto:
                file, _, fragment = target.partition("#")
                dest = (doc.parent / file).resolve() if file else doc
                if not dest.exists():
                    broken.append(f"{doc.name}:{number}: {target}: no such file")
                elif fragment and dest.suffix == ".md":
                    if dest not in anchors:
                        anchors[dest] = heading_anchors(dest)
                    if fragment not in anchors[dest]:
                        broken.append(f"{doc.name}:{number}: {target}: no such heading")
    assert broken == []
