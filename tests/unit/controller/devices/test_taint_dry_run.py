"""``tranche taint --dry-run``: the rule that would be written and the claims whose pods
it would evict, as one YAML document; nothing written; the exit status of the real run."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from controller.devices.lookup import ClusterDevice
from tests.unit.controller.devices.rule_store import RuleStore

DRIVER = "gpu.tranche.dev"
GPU = ClusterDevice(DRIVER, "node-a", "node-a", "gpu-1a2b3c4d", "gpu", "GPU-1a2b3c4d-0", "")
TAINT = ("node-a", "gpu-1a2b3c4d", "--effect", "NoExecute", "--reason", "fan failure")


def holding(namespace: str, name: str) -> dict[str, Any]:
    result = {"driver": DRIVER, "pool": "node-a", "device": GPU.name, "request": "gpu"}
    return {
        "metadata": {"namespace": namespace, "name": name},
        "status": {"allocation": {"devices": {"results": [result]}}},
    }


def without_version(rule: dict[str, Any]) -> dict[str, Any]:
    meta = {k: v for k, v in rule["metadata"].items() if k != "resourceVersion"}
    return {**rule, "metadata": meta}


def test_dry_run_prints_the_rule_and_the_claims_it_would_evict_and_writes_nothing(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    store = RuleStore(devices=[GPU], claims=[holding("team-a", "train")])
    assert store.tranche(monkeypatch, "taint", *TAINT, "--dry-run") == 0
    assert store.writes == []
    assert store.rules == {}
    out = capsys.readouterr().out
    head, note = out.splitlines()[:2]
    assert head.startswith("# dry run, nothing written: would create DeviceTaintRule tranche-")
    assert head.endswith("tainting node-a/gpu-1a2b3c4d gpu.tranche.dev/admin:NoExecute")
    assert note == (
        "# would evict the pods of 1 claim(s) using it, unless a claim tolerates "
        "gpu.tranche.dev/admin:NoExecute: team-a/train"
    )
    shown = yaml.safe_load(out)
    assert shown["kind"] == "DeviceTaintRule"
    assert shown["spec"]["deviceSelector"] == {
        "driver": DRIVER,
        "pool": "node-a",
        "device": "gpu-1a2b3c4d",
    }
    assert shown["metadata"]["annotations"]["gpu.tranche.dev/reason"] == "fan failure"
    assert store.dry_runs == [("POST", shown["metadata"]["name"])]  # the server checked it

    # The real run writes exactly the rule shown.
    assert store.tranche(monkeypatch, "taint", *TAINT) == 0
    assert [without_version(r) for r in store.rules.values()] == [shown]


def test_dry_run_of_a_tainted_device_shows_the_replacement(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Tainting again with a new reason: the rule shown keeps its ``timeAdded`` (pods that
    tolerate the taint for a while get no fresh grace period) and no claim is listed."""
    store = RuleStore(devices=[GPU])
    assert store.tranche(monkeypatch, "taint", *TAINT) == 0
    [name] = store.rules
    store.rules[name]["spec"]["taint"]["timeAdded"] = "2026-01-02T03:04:05Z"
    before = dict(store.rules)
    capsys.readouterr()
    args = [*TAINT[:-1], "RMA 4411", "--dry-run"]
    assert store.tranche(monkeypatch, "taint", *args) == 0
    assert store.rules == before
    out = capsys.readouterr().out
    assert out.startswith(f"# dry run, nothing written: would replace DeviceTaintRule {name}")
    assert out.splitlines()[1] == "# no claim uses it"
    shown = yaml.safe_load(out)
    assert shown["spec"]["taint"]["timeAdded"] == "2026-01-02T03:04:05Z"
    assert shown["metadata"]["annotations"]["gpu.tranche.dev/reason"] == "RMA 4411"


@pytest.mark.parametrize("dry_run", [False, True])
@pytest.mark.parametrize(
    ("argv", "refuse", "error"),
    [
        (("node-a", "gpu-1a2b3c4e"), False, "device 'gpu-1a2b3c4e' does not exist on node"),
        (("node-a", "gpu-1a2b3c4d"), True, "403 Forbidden: cannot post"),
    ],
    ids=["unknown device", "write refused"],
)
def test_dry_run_fails_as_the_real_run_would(
    argv: tuple[str, ...],
    refuse: bool,
    error: str,
    dry_run: bool,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The server is asked to check the write (dryRun=All): a role that may not create the
    rule learns it from the dry run, with the same message and exit status."""
    store = RuleStore(devices=[GPU], refuse_writes=refuse)
    flags = ("--dry-run",) if dry_run else ()
    assert store.tranche(monkeypatch, "taint", *argv, "--reason", "x", *flags) == 1
    assert error in capsys.readouterr().err
    assert store.rules == {}


def test_a_dry_run_variable_left_in_the_shell_does_not_stop_a_taint(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``TRANCHE_DRY_RUN`` is the twin of the plugin's ``--dry-run``; left set, it must not
    turn a script's ``taint`` into a no-op that still exits 0 (a faulty GPU kept in service)."""
    store = RuleStore(devices=[GPU])
    assert store.tranche(monkeypatch, "taint", *TAINT, env={"TRANCHE_DRY_RUN": "yes"}) == 0
    assert len(store.rules) == 1
    assert not capsys.readouterr().out.startswith("# dry run")
