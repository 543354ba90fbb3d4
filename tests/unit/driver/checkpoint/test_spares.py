"""Claim files of ended claims reused for the next claims' writes (driver.checkpoint.spares):
the same inode comes back, a crash mid-write loses nothing, spares stay bounded, a spare
another process removed is skipped, and a start-up sweeps them."""

from __future__ import annotations

from pathlib import Path

import pytest

from driver.checkpoint.spares import PREFIX, SpareFiles
from driver.checkpoint.store import Checkpoint, ClaimRecord
from driver.faults import FaultPoints
from tests.unit.driver.checkpoint.test_store import ended, record, started


class Crash(Exception):
    pass


def spares_in(tmp_path: Path) -> list[Path]:
    return sorted((tmp_path / "checkpoint.d").glob(f"{PREFIX}*"))


def claim_file(tmp_path: Path, uid: str) -> Path:
    return tmp_path / "checkpoint.d" / f"{uid}.json"


def states(tmp_path: Path) -> dict[str, str]:
    data, _ = Checkpoint(tmp_path / "checkpoint.json", boot_id="b").load()
    return {uid: c.state for uid, c in data.claims.items()}


def completed(uid: str) -> ClaimRecord:
    return record(uid, prepared_at=2.0)


def test_an_ended_claims_file_is_written_again_once_its_rename_is_on_disk(
    tmp_path: Path,
) -> None:
    """The next claim written after an unprepare gets a new file (the spare's rename is not
    yet on disk: a crash while filling it could leave the new bytes under the old name); the
    one after it, once that write fsynced the directory, gets the spare's inode."""
    cp = Checkpoint(tmp_path / "checkpoint.json", boot_id="b")
    cp.put(completed("u0"))
    inode = claim_file(tmp_path, "u0").stat().st_ino
    cp.remove("u0", ended("u0", 2.0))
    (spare,) = spares_in(tmp_path)
    assert spare.stat().st_ino == inode
    cp.put(completed("u1"))
    assert claim_file(tmp_path, "u1").stat().st_ino != inode
    cp.put(started("u2"))
    cp.put(completed("u2"))
    assert claim_file(tmp_path, "u2").stat().st_ino == inode
    assert spares_in(tmp_path) == []
    assert states(tmp_path) == {"u1": "PrepareCompleted", "u2": "PrepareCompleted"}
    reread = Checkpoint(tmp_path / "checkpoint.json", boot_id="b").load()[0].claims["u2"]
    assert reread == completed("u2")  # whole, checksum and all


def test_a_crash_while_a_spare_is_written_loses_nothing(tmp_path: Path) -> None:
    """Killed after the spare holds the new record, before its rename: the claim is still
    half-prepared (rolled back at start-up) and the start-up sweeps the spare."""
    armed = [False]

    def crash(point: str) -> None:
        if armed[0]:
            raise Crash(point)

    faults = FaultPoints(point="checkpoint:before-replace", action=crash)
    cp = Checkpoint(tmp_path / "checkpoint.json", boot_id="b", faults=faults)
    cp.put(completed("u0"))
    cp.remove("u0", ended("u0", 2.0))
    cp.put(completed("u9"))  # the spare's rename is on disk from here
    cp.put(started("u1"))
    armed[0] = True
    with pytest.raises(Crash):
        cp.put(completed("u1"))
    assert not claim_file(tmp_path, "u1").exists()
    (filled,) = spares_in(tmp_path)  # the crash came while u0's old file held u1's record
    assert b'"uid":"u1"' in filled.read_bytes()
    restarted = Checkpoint(tmp_path / "checkpoint.json", boot_id="b")
    restarted.remove_temporaries()
    data, status = restarted.load(locked=True)
    assert status.kind == "ok"
    states_now = {uid: c.state for uid, c in data.claims.items()}
    assert states_now == {"u1": "PrepareStarted", "u9": "PrepareCompleted"}
    assert [a.claim_uid for a in data.history] == ["u0"]
    assert spares_in(tmp_path) == []


def test_a_spare_another_process_removed_is_skipped(tmp_path: Path) -> None:
    """A second plugin pod's start-up sweeps the first one's spares: its next write makes a
    new file."""
    cp = Checkpoint(tmp_path / "checkpoint.json", boot_id="b")
    cp.put(completed("u0"))
    cp.remove("u0", ended("u0", 2.0))
    Checkpoint(tmp_path / "checkpoint.json", boot_id="b").remove_temporaries()
    assert spares_in(tmp_path) == []
    cp.put(completed("u1"))
    assert states(tmp_path) == {"u1": "PrepareCompleted"}


def test_spares_are_bounded(tmp_path: Path) -> None:
    spares = SpareFiles(tmp_path, limit=2)
    spares.keep(tmp_path / "gone.json")  # already removed: nothing kept
    assert len(spares) == 0
    for i in range(3):
        (tmp_path / f"c{i}.json").write_bytes(b"{}")
        spares.keep(tmp_path / f"c{i}.json")
    assert len(spares) == 2
    assert len(list(tmp_path.glob(f"{PREFIX}*"))) == 2
    assert not list(tmp_path.glob("c*.json"))  # the third deleted
