"""On/off flags' environment twins: a value that is neither is refused, naming the variable,
instead of silently meaning off (``TRANCHE_DEVICE_PLUGIN_CHECK=ture`` once turned the check
off)."""

from __future__ import annotations

import json

import pytest

from driver.cli import main


@pytest.mark.parametrize("variable", ["TRANCHE_CLAIM_STATUS", "TRANCHE_DEVICE_PLUGIN_CHECK"])
def test_a_twin_that_is_neither_on_nor_off_is_a_clear_error(
    variable: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(variable, "ture")
    assert main(["kubelet-plugin", "--node-name", "n", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert f"{variable}='ture'" in err and "neither on" in err


@pytest.mark.parametrize(("value", "expected"), [("Off", False), (" yes ", True), ("0", False)])
def test_on_and_off_words_are_read_whatever_their_case(
    value: str, expected: bool, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("TRANCHE_CLAIM_STATUS", value)
    assert main(["kubelet-plugin", "--node-name", "n", "--dry-run"]) == 0
    assert json.loads(capsys.readouterr().out)["claim_status"] is expected
    monkeypatch.setenv("TRANCHE_CLAIM_STATUS", "off")
    assert main(["kubelet-plugin", "--node-name", "n", "--dry-run", "--claim-status"]) == 0
    assert json.loads(capsys.readouterr().out)["claim_status"] is True, "the flag wins"
