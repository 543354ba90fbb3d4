"""A value that is not a number, not one of a flag's choices, not an address or not an IP
address is refused naming the flag and its environment twin, whether it came from the flag
or the twin (argparse checks choices only of a flag's own value), never as a bare Python or
pydantic message."""

from __future__ import annotations

import argparse
import json

import pytest

from driver.cli import build_parser, load_commands, main
from driver.errors import ConfigError
from driver.flags import env_name

PLUGIN = ["kubelet-plugin", "--node-name", "n", "--dry-run"]


@pytest.mark.parametrize(
    ("variable", "value", "says"),
    [
        ("TRANCHE_SAMPLE_INTERVAL", "10s", "'10s' is not a number"),
        ("TRANCHE_GRPC_WORKERS", "six", "'six' is not a whole number"),
        ("TRANCHE_DEFAULT_TRUST_LEVEL", "Isolated", "'Isolated' is not one of dedicated, "),
        ("TRANCHE_NVML", "sim", "'sim' is not one of real, simulated"),
        ("TRANCHE_LOG_FORMAT", "yaml", "'yaml' is not one of text, json"),
        ("TRANCHE_LOG_LEVEL", "debug", "'debug' is not one of DEBUG, INFO, WARNING, ERROR"),
        ("TRANCHE_METRICS_ADDRESS", "9400", "'9400' is not HOST:PORT"),
        ("TRANCHE_HEALTH_ADDRESS", "localhost", "'localhost' is not HOST:PORT"),
    ],
)
def test_a_bad_plugin_twin_names_the_flag_and_the_variable(
    variable: str,
    value: str,
    says: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv(variable, value)
    flag = "--" + variable.removeprefix("TRANCHE_").lower().replace("_", "-")
    assert main(PLUGIN) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"tranche kubelet-plugin: {flag} [env {variable}]: {says}")
    assert "validation error" not in err


def test_the_flag_wins_over_a_bad_twin(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("TRANCHE_NVML", "sim")
    assert main([*PLUGIN, "--nvml", "simulated"]) == 0
    assert json.loads(capsys.readouterr().out)["nvml"] == "simulated"


@pytest.mark.parametrize(
    ("variable", "value", "says"),
    [
        ("TRANCHE_LOG_LEVEL", "info", "'info' is not one of DEBUG, INFO, WARNING, ERROR"),
        ("TRANCHE_SYNC_INTERVAL", "10s", "'10s' is not a number"),
        ("TRANCHE_WEBHOOK_IP_SANS", "10.0.0.1,foo", "'foo' is not an IP address"),
        ("TRANCHE_WEBHOOK_ADDRESS", "8443", "'8443' is not HOST:PORT"),
    ],
)
def test_a_bad_controller_twin_names_the_flag_and_the_variable(
    variable: str,
    value: str,
    says: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv(variable, value)
    flag = "--" + variable.removeprefix("TRANCHE_").lower().replace("_", "-")
    assert main(["controller", "--namespace", "tranche"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tranche controller: ")
    assert f"{flag} [env {variable}]: {says}" in err
    assert "validation error" not in err


@pytest.mark.parametrize(
    ("variable", "value", "says"),
    [
        ("TRANCHE_NVML", "sim", "'sim' is not one of real, simulated"),
        ("TRANCHE_OUTPUT", "yml", "'yml' is not one of table, yaml, json"),
    ],
)
def test_a_bad_devices_twin_names_the_flag_and_the_variable(
    variable: str,
    value: str,
    says: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv(variable, value)
    flag = "--" + variable.removeprefix("TRANCHE_").lower().replace("_", "-")
    assert main(["devices"]) == 2
    assert capsys.readouterr().err.startswith(f"tranche devices: {flag} [env {variable}]: {says}")


@pytest.mark.parametrize(
    ("command", "says"),
    [
        (
            ["explain", "free"],
            "tranche explain: --output [env TRANCHE_OUTPUT]: 'yaml' is not one of",
        ),
        (["cluster-devices"], "tranche cluster-devices: --output [env TRANCHE_OUTPUT]: 'yaml' is"),
        (  # was a pydantic message naming the model's field
            ["report", "--metrics-url", "http://127.0.0.1:1/metrics"],
            "tranche report: --output [env TRANCHE_OUTPUT]: 'yaml' is not one of",
        ),
        (["trust", "check"], "tranche trust: --output [env TRANCHE_OUTPUT]: 'yaml' is not"),
    ],
)
def test_a_bad_output_twin_is_refused_not_read_as_text(
    command: list[str],
    says: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Refused before any API read (the kubeconfig below does not exist)."""
    monkeypatch.setenv("TRANCHE_OUTPUT", "yaml")
    monkeypatch.setenv("TRANCHE_KUBECONFIG", "/nonexistent/kubeconfig")
    assert main(command) == 2
    assert capsys.readouterr().err.startswith(says)


def _options_with_choices() -> list[tuple[list[str], str, tuple[str, ...]]]:
    """(the command's words, the flag, its choices) of every option with choices, in every
    ``tranche`` command and subcommand."""
    found: list[tuple[list[str], str, tuple[str, ...]]] = []

    def walk(parser: argparse.ArgumentParser, words: list[str]) -> None:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    walk(sub, [*words, name])
            elif (
                action.choices
                and action.option_strings
                and f"[env {env_name(action.option_strings[0])}]" in (action.help or "")
            ):  # taint's --effect, a plain argparse flag without a twin, is checked by argparse
                found.append((words, action.option_strings[0], tuple(action.choices)))

    walk(build_parser(load_commands()), [])
    return found


def _argv(words: list[str], flag: str | None = None, value: str = "") -> list[str]:
    """``words`` with a value for each required argument of that (sub)command: enough to
    get past argparse's own checks, not to run."""
    parser = build_parser(load_commands())
    argv: list[str] = []
    for word in words:
        argv.append(word)
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = sub.choices[word]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            continue
        if not action.option_strings:  # a positional
            argv.append(str(next(iter(action.choices))) if action.choices else "x")
        elif action.required:
            argv += [action.option_strings[0], "x"]
    return argv + ([flag, value] if flag else [])


OPTIONS = _options_with_choices()


def test_the_walk_finds_the_flags_with_choices() -> None:
    """A guard on the walk below: it sees the commands' and subcommands' choices."""
    flags = {(" ".join(words), flag) for words, flag, _ in OPTIONS}
    assert {
        ("kubelet-plugin", "--log-level"),
        ("report", "--idle-policy"),
        ("trust check", "--output"),
        ("trust check", "--default-trust-level"),
    } <= flags


@pytest.mark.parametrize(
    ("words", "flag", "choices"), OPTIONS, ids=[f"{' '.join(w)} {f}" for w, f, _ in OPTIONS]
)
def test_every_twin_with_choices_is_refused_as_the_flags_are_parsed(
    words: list[str],
    flag: str,
    choices: tuple[str, ...],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Whatever command it belongs to, a twin's value that is not one of the flag's choices
    stops the parse with an error naming the flag and the twin, before the command reads
    anything (``tranche report --output`` and ``--idle-policy``, ``tranche trust check
    --output`` and ``--default-trust-level`` took a bad twin to a pydantic message, or to the
    API server first); the flag given on the command line still wins over it."""
    variable = env_name(flag)
    monkeypatch.setenv(variable, "not-a-choice")
    with pytest.raises(
        ConfigError, match=rf"^{flag} \[env {variable}\]: 'not-a-choice' is not one of"
    ):
        build_parser(load_commands()).parse_args(_argv(words))
    args = build_parser(load_commands()).parse_args(_argv(words, flag, str(choices[0])))
    assert getattr(args, flag[2:].replace("-", "_")) == choices[0]
