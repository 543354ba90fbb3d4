"""A bad ``tranche controller`` setting stops it with one message naming the flag."""

from __future__ import annotations

import argparse

import pytest

from controller.main import run
from controller.settings import add_arguments


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["--sync-interval", "abc"], "--sync-interval"),
        (["--slice-gc-interval", "soon"], "--slice-gc-interval"),
        (["--cert-validity-days", "1.5"], "--cert-validity-days"),
        (["--ca-validity-days", "x"], "--ca-validity-days"),
        (["--sync-interval", "0"], "sync_interval_s"),
        (["--sync-interval", "1e-9"], "sync_interval_s"),  # a busy loop against the API server
        (["--slice-gc-interval", "0.001"], "--slice-gc-interval [env TRANCHE_SLICE_GC_INTERVAL]"),
        (["--driver-name", "gpu tranche"], "--driver-name [env TRANCHE_DRIVER_NAME]"),
        (["--lease-name", ""], "--lease-name [env TRANCHE_LEASE_NAME]"),
        (["--tls-secret", ""], "--tls-secret [env TRANCHE_TLS_SECRET]"),
        (["--webhook-config", "Legacy_GPU"], "--webhook-config [env TRANCHE_WEBHOOK_CONFIG]"),
        (["--webhook-service", "s" * 254], "--webhook-service [env TRANCHE_WEBHOOK_SERVICE]"),
    ],
)
def test_a_bad_value_names_the_flag(
    argv: list[str], flag: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TRANCHE_SYNC_INTERVAL", raising=False)
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert run(parser.parse_args(["--namespace", "tranche", *argv])) == 2
    err = capsys.readouterr().err
    assert err.startswith("tranche controller: invalid setting: ")
    assert not err.startswith("tranche controller: tranche controller:")
    assert flag in err


def test_an_empty_lease_name_from_the_environment_is_refused_at_start(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An empty name would make every replica write the Lease collection: none would lead."""
    monkeypatch.setenv("TRANCHE_LEASE_NAME", "")
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert run(parser.parse_args(["--namespace", "tranche"])) == 2
    assert "--lease-name [env TRANCHE_LEASE_NAME]: '' is not an object name" in (
        capsys.readouterr().err
    )
