"""The taint a node's devices carry while a claim whose checkpoint file was corrupt is held."""

from __future__ import annotations

from pathlib import Path

from driver.checkpoint.holds import TAINT_KEY, Hold, read, taint


def test_no_hold_no_taint() -> None:
    assert taint([]) is None


def test_the_taint_names_the_oldest_hold_and_keeps_its_time() -> None:
    newer = Hold("u2", Path("u2.hold"), "u2.json.corrupt-x", "b", since=1_796_400_000.9)
    older = Hold("u1", Path("u1.hold"), "u1.json.corrupt-x", None, since=1_796_300_000.0)
    assert taint([newer, older]) == {
        "key": TAINT_KEY,
        "value": "u1",
        "effect": "NoSchedule",
        "timeAdded": "2026-12-03T12:13:20Z",
    }
    assert taint([older, newer]) == taint([newer, older])  # republishing changes nothing


def test_a_uid_that_is_no_label_value_leaves_the_value_out() -> None:
    """The API server refuses a slice whose taint value is no label value, and that would
    take every device of the node out of the cluster."""
    odd = Hold("x" * 64, Path("x.hold"), "x.json.corrupt-x", None, since=0.0)
    assert "value" not in (taint([odd]) or {})


def test_a_hold_that_cannot_be_read_still_holds_and_fails_no_read(tmp_path: Path) -> None:
    """Not JSON, or not even a file (a directory an administrator made): held, as this
    boot's, so it is never deleted as another boot's; the read itself never fails."""
    (tmp_path / "u1.hold").write_text("not json")
    (tmp_path / "u2.hold").mkdir()
    found, deleted = read(tmp_path, "boot-1", delete_other_boots=True)
    assert not deleted
    assert {uid: h.boot_id for uid, h in found.items()} == {"u1": None, "u2": None}
