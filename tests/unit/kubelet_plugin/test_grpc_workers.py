"""``--grpc-workers``: how many kubelet calls the plugin serves at once, from the flag or its
environment twin, refused with the flag's name when it is not a whole number in range."""

from __future__ import annotations

import argparse
import re

import pytest

from driver.cli import main
from driver.errors import ConfigError
from kubelet_plugin import settings as plugin_settings


def _settings(args: list[str]) -> plugin_settings.PluginSettings:
    parser = argparse.ArgumentParser()
    plugin_settings.add_arguments(parser)
    return plugin_settings.settings_from_args(parser.parse_args(["--node-name", "n1", *args]))


def test_six_threads_serve_the_dra_socket_unless_told_otherwise(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("TRANCHE_GRPC_WORKERS", raising=False)
    assert _settings([]).grpc_workers == 6
    assert _settings(["--grpc-workers", "16"]).grpc_workers == 16
    monkeypatch.setenv("TRANCHE_GRPC_WORKERS", "24")
    assert _settings([]).grpc_workers == 24


@pytest.mark.parametrize(
    ("value", "said"),
    [
        ("many", "--grpc-workers [env TRANCHE_GRPC_WORKERS]: 'many' is not a whole number"),
        (
            "1",
            "--grpc-workers [env TRANCHE_GRPC_WORKERS]: Input should be greater than or equal "
            "to 2 (got 1)",
        ),
        (
            "65",
            "--grpc-workers [env TRANCHE_GRPC_WORKERS]: Input should be less than or equal "
            "to 64 (got 65)",
        ),
    ],
)
def test_a_bad_worker_count_is_refused_naming_the_flag_and_its_twin(value: str, said: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(said)):
        _settings(["--grpc-workers", value])


@pytest.mark.parametrize(
    ("variable", "value", "said"),
    [
        ("TRANCHE_GRPC_WORKERS", "1", "--grpc-workers [env TRANCHE_GRPC_WORKERS]: "),
        ("TRANCHE_SAMPLE_INTERVAL", "0", "--sample-interval [env TRANCHE_SAMPLE_INTERVAL]: "),
        ("TRANCHE_DRIVER_NAME", "Bad_Name", "--driver-name [env TRANCHE_DRIVER_NAME]: "),
    ],
)
def test_a_bad_value_from_the_environment_names_the_flag_once_per_line(
    variable: str,
    value: str,
    said: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """What an operator set (the DaemonSet's environment), not the settings model's field."""
    monkeypatch.setenv(variable, value)
    assert main(["kubelet-plugin", "--node-name", "n1", "--dry-run"]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"tranche kubelet-plugin: invalid setting: {said}"), line
    assert "(got " in line and line.count("tranche kubelet-plugin:") == 1, line
