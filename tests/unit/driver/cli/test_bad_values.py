"""A value that is not a number, not one of a flag's choices, not an address or not an IP
address is refused naming the flag and its environment twin, whether it came from the flag
or the twin (argparse checks choices only of a flag's own value), never as a bare Python or
pydantic message."""

from __future__ import annotations

import json

import pytest

from driver.cli import main

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
    assert f"tranche controller: invalid setting: {flag} [env {variable}]: {says}" in err
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
    assert main(["devices"]) == 1
    assert capsys.readouterr().err.startswith(f"tranche devices: {flag} [env {variable}]: {says}")


@pytest.mark.parametrize(
    ("command", "says"),
    [
        (
            ["explain", "free"],
            "tranche explain: --output [env TRANCHE_OUTPUT]: 'yaml' is not one of",
        ),
        (["cluster-devices"], "tranche cluster-devices: --output [env TRANCHE_OUTPUT]: 'yaml' is"),
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
