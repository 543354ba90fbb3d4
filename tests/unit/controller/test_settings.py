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
