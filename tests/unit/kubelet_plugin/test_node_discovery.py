"""Discovery at start: a busy or garbled answer is waited out, only a 404 means not served."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from driver.kube.http import RawAnswer
from tests.unit.kubelet_plugin.sim_plugin import sim_plugin
from tests.unit.kubelet_plugin.slice_api import SliceApi, answer

BUSY = {
    "503": answer(503, {"kind": "Status", "code": 503, "message": "unable to handle"}),
    "429": answer(429, {"kind": "Status", "code": 429, "message": "too many requests"}),
    "html": RawAnswer(200, "OK", b"<html>upgrading</html>"),
}


def once(api: SliceApi, path: str, bad: RawAnswer) -> list[str]:
    """Answer ``path`` with ``bad`` the first time it is asked; the paths asked for after."""
    asked: list[str] = []

    def override(method: str, asked_path: str) -> RawAnswer | None:
        if asked_path != path:
            return None
        asked.append(asked_path)
        return bad if len(asked) == 1 else None

    api.answers.append(override)
    return asked


@pytest.mark.parametrize("bad", sorted(BUSY))
@pytest.mark.parametrize(
    "path", ["/version", "/apis/resource.k8s.io", "/apis/scheduling.k8s.io/v1beta1"]
)
def test_one_busy_answer_to_discovery_is_waited_out(tmp_path: Path, path: str, bad: str) -> None:
    api = SliceApi()
    plugin = sim_plugin(tmp_path, api)
    asked = once(api, path, BUSY[bad])
    try:
        assert plugin._discover_when_reachable(threading.Event())
    finally:
        api.close()
    assert len(asked) == 2  # asked again after the busy answer
    features = plugin.features
    assert features is not None
    assert (features.resource_v1, features.slice_layout, features.device_taints) == (
        True,
        "split",
        True,
    )
    assert features.pod_group_version == "v1beta1"
    assert plugin.ready() == "ResourceSlices not published yet"  # not "does not serve ..."


def test_a_404_on_the_resource_group_means_not_served(tmp_path: Path) -> None:
    api = SliceApi()
    plugin = sim_plugin(tmp_path, api)
    missing = answer(404, {"message": "not found"})
    api.answers.append(lambda _m, p: missing if p == "/apis/resource.k8s.io" else None)
    try:
        assert plugin._discover_when_reachable(threading.Event())
    finally:
        api.close()
    ready = plugin.ready()
    assert ready is not None and "does not serve resource.k8s.io/v1 ResourceSlices" in ready
