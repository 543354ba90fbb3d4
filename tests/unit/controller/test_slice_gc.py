"""The slice clean-up deletes only this driver's slices whose node is gone: a node list that
comes back without its items (a misrouted proxy's 404, an empty body) fails the pass instead
of reading as "no nodes", and a slice of another driver is left alone.

The API server is canned at the transport (``controller.kube_client.send``).
"""

from __future__ import annotations

import json
from typing import Any, cast

import pytest
from kubernetes import client

from controller.main import Controller
from controller.settings import ControllerSettings
from driver.kube.http import RawAnswer

DRIVER = "gpu.tranche.dev"


def _slice(node: str, driver: str = DRIVER) -> dict[str, Any]:
    return {
        "metadata": {"name": f"{node}-{driver}", "uid": f"uid-{node}"},
        "spec": {"driver": driver, "nodeName": node},
    }


class CannedApi:
    def __init__(self, slices: list[dict[str, Any]], nodes: RawAnswer) -> None:
        self.slices = slices
        self.nodes = nodes
        self.deleted: list[str] = []

    def send(self, _api: Any, method: str, path: str, **_: Any) -> RawAnswer:
        if method == "DELETE":
            self.deleted.append(path.rsplit("/", 1)[-1])
            return RawAnswer(200, "OK", b"{}")
        if path.endswith("/resourceslices"):
            return RawAnswer(200, "OK", json.dumps({"items": self.slices}).encode())
        if path == "/api/v1/nodes":
            return self.nodes
        raise AssertionError(f"unexpected request {method} {path}")


def _gc_pass(monkeypatch: pytest.MonkeyPatch, api: CannedApi) -> Controller:
    monkeypatch.setattr("controller.kube_client.send", api.send)
    settings = ControllerSettings(namespace="tranche", identity="replica-1")
    controller = Controller(settings, cast(client.ApiClient, object()))
    controller.run_once(leader=True)
    return controller


def _nodes(*names: str) -> RawAnswer:
    items = [{"metadata": {"name": n}} for n in names]
    return RawAnswer(200, "OK", json.dumps({"items": items}).encode())


@pytest.mark.parametrize(
    "nodes",
    [
        RawAnswer(404, "Not Found", b"404 page not found"),
        RawAnswer(200, "OK", b""),
        RawAnswer(200, "OK", b'{"kind": "NodeList"}'),
        RawAnswer(200, "OK", b'{"items": null}'),
    ],
    ids=["404", "empty body", "no items", "items null"],
)
def test_a_node_list_without_items_deletes_nothing_and_fails_the_pass(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, nodes: RawAnswer
) -> None:
    api = CannedApi([_slice("node-1"), _slice("node-2")], nodes)
    controller = _gc_pass(monkeypatch, api)
    assert api.deleted == []
    errors = controller.metrics.registry.get_sample_value
    assert errors("tranche_controller_loop_errors_total", {"loop": "slice-gc"}) == 1.0
    assert "slice clean-up failed error=list nodes: " in caplog.text


def test_a_slice_of_another_driver_is_never_deleted(monkeypatch: pytest.MonkeyPatch) -> None:
    # A proxy or API server that ignores the field selector returns every driver's slices.
    slices = [_slice("gone"), _slice("gone", "other.example.com"), _slice("node-1")]
    api = CannedApi(slices, _nodes("node-1"))
    _gc_pass(monkeypatch, api)
    assert api.deleted == [f"gone-{DRIVER}"]
