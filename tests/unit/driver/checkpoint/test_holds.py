"""The taint a node's devices carry while a claim whose checkpoint file was corrupt is held."""

from __future__ import annotations

from pathlib import Path

from driver.checkpoint.holds import TAINT_KEY, Hold, taint


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
