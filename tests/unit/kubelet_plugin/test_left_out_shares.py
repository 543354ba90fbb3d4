"""Share devices left out for Kubernetes 1.34's slice limits: said once per change."""

from __future__ import annotations

from typing import Any

from kubelet_plugin.event_recorder import EventType
from kubelet_plugin.left_out_shares import LeftOutShares


def _share(gpu: str, group: str) -> dict[str, Any]:
    return {"name": f"{gpu}-ts-{group}", "attributes": {"sharingGroup": {"string": group}}}


def test_each_change_is_said_once_and_the_return_says_so_too() -> None:
    events: list[tuple[EventType, str, str]] = []
    report = LeftOutShares("node-a", lambda *e: events.append(e))
    extra = {"gpu-1": [_share("gpu-1", g) for g in ("blue", "red")]}
    assert report.update(extra, {"gpu-1": ("red",)}, 1024) == 1
    assert report.update(extra, {"gpu-1": ("red",)}, 1024) == 1  # no change: nothing said
    assert report.update(extra, {}, 1024) == 0  # fits again (a group removed elsewhere)
    assert [(t, r) for t, r, _ in events] == [
        ("Warning", "SharesNotPublished"),
        ("Normal", "SharesPublished"),
    ]
    assert "GPU gpu-1 on node node-a: share devices of sharing groups red" in events[0][2]
