"""``/readyz`` of the plugin: registered with the kubelet and its slices published."""

from __future__ import annotations

import threading
from pathlib import Path

from driver.kube.http import RawAnswer
from kubelet_plugin.registration import RegistrationStatus
from tests.unit.kubelet_plugin.sim_plugin import sim_plugin
from tests.unit.kubelet_plugin.slice_api import SliceApi
from tests.waiting import wait_for


def test_a_registered_plugin_is_not_ready_until_its_slices_are_published(tmp_path: Path) -> None:
    """A rolling update deletes the old pod once the new one is ready: with nothing
    published yet the scheduler would see no device of the node meanwhile."""
    api = SliceApi()
    plugin = sim_plugin(tmp_path, api)
    slow = threading.Event()  # a slow API server: the first sync's Node read waits

    def node_read(method: str, path: str) -> RawAnswer | None:
        if path == "/api/v1/nodes/node-a":
            slow.wait(30)
        return None

    api.answers.append(node_read)
    plugin.server.registration.record(RegistrationStatus(registered=True))
    plugin.republish()
    plugin.publisher.start()
    try:
        assert plugin.ready() == "ResourceSlices not published yet"
        assert api.slices == {}
        slow.set()
        assert plugin.publisher.wait_published(10)
        wait_for("ready", lambda: plugin.ready() is None, timeout_s=10)
        assert api.slices
    finally:
        slow.set()
        plugin.publisher.stop()
        api.close()
