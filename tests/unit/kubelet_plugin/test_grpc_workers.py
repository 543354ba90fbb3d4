"""``--grpc-workers``: how many kubelet calls the plugin serves at once, from the flag or its
environment twin, refused with the flag's name when it is not a whole number in range."""

from __future__ import annotations

import argparse

import pytest

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
        ("1", "grpc_workers"),
        ("65", "grpc_workers"),
    ],
)
def test_a_bad_worker_count_is_refused_naming_the_setting(value: str, said: str) -> None:
    with pytest.raises(ConfigError, match=said.replace("[", r"\[").replace("]", r"\]")):
        _settings(["--grpc-workers", value])
