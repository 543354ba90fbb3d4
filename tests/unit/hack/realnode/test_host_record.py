"""The machine record: first cluster records, later ones copy it, the last one restores."""

from __future__ import annotations

from pathlib import Path

import pytest

from hack.devcluster.realnode import host


@pytest.fixture
def machine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    sysctl = tmp_path / "proc-sys"
    (sysctl / "kernel").mkdir(parents=True)
    (sysctl / "kernel" / "panic").write_text("1\n")
    monkeypatch.setattr(host, "_SYSCTL_ROOT", sysctl)
    monkeypatch.setattr(host, "WATCHED_SYSCTLS", ("kernel/panic",))
    monkeypatch.setattr(host, "WATCHED_PATHS", (str(tmp_path / "var-lib-cni"),))
    monkeypatch.setattr(host, "REGISTRY", tmp_path / "run-registry")
    return tmp_path


def test_single_cluster_restores_sysctls_and_removes_created_paths(machine: Path) -> None:
    record = machine / "a" / "n" / "host.json"
    host.record_machine(record)
    (machine / "proc-sys" / "kernel" / "panic").write_text("10\n")  # the kubelet's change
    (machine / "var-lib-cni" / "results").mkdir(parents=True)
    undone = host.restore_machine(record)
    assert (machine / "proc-sys" / "kernel" / "panic").read_text().strip() == "1"
    assert not (machine / "var-lib-cni").exists()
    assert "sysctl kernel.panic=1" in undone
    assert not record.exists()
    assert not (machine / "run-registry").exists()


def test_second_cluster_copies_the_original_and_the_last_one_restores(machine: Path) -> None:
    a = machine / "a" / "n" / "host.json"
    b = machine / "b" / "n" / "host.json"
    panic = machine / "proc-sys" / "kernel" / "panic"
    host.record_machine(a)
    panic.write_text("10\n")
    host.record_machine(b)  # sees 10 now, but must keep A's original 1
    assert host.restore_machine(a) == []  # B still runs: nothing restored yet
    assert panic.read_text().strip() == "10"
    assert host.restore_machine(b) == ["sysctl kernel.panic=1"]
    assert panic.read_text().strip() == "1"


def test_record_is_kept_while_a_node_runs(machine: Path) -> None:
    record = machine / "a" / "n" / "host.json"
    host.record_machine(record)
    (machine / "proc-sys" / "kernel" / "panic").write_text("10\n")
    host.record_machine(record)  # a second node of the same cluster
    assert '"kernel/panic": "1"' in record.read_text()


def test_restore_without_record_is_a_no_op(machine: Path) -> None:
    assert host.restore_machine(machine / "none" / "host.json") == []


def test_mountinfo_escapes_are_decoded() -> None:
    assert host._unescape(r"/tmp/a\040b") == "/tmp/a b"
    assert host._unescape("/plain") == "/plain"
