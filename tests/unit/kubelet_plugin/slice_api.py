"""An API server in memory for the slice publisher's and discovery's tests: the Node,
ResourceSlices and discovery, unreachable while ``down``; ``answers`` override a path's
answer."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Mapping
from typing import Any

from driver.kube.http import ApiUnreachable, KubeClient, RawAnswer, Watch
from driver.kube.kubeconfig import Credentials

SLICES = "/apis/resource.k8s.io/v1/resourceslices"
Answer = Callable[[str, str], RawAnswer | None]  # (method, path): an answer, or None to pass


def answer(status: int, obj: object) -> RawAnswer:
    return RawAnswer(status, "x", json.dumps(obj).encode())


def slice_of(node: str, driver: str, devices: list[str]) -> dict[str, Any]:
    """One ResourceSlice of ``node``'s pool with these devices."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-gpus"},
        "spec": {
            "driver": driver,
            "nodeName": node,
            "pool": {"name": node, "generation": 0, "resourceSliceCount": 1},
            "devices": [{"name": d} for d in devices],
        },
    }


def _version(group: str, version: str) -> dict[str, Any]:
    return {"groupVersion": f"{group}/{version}", "version": version}


# A 1.37 server with the Workload API on: what the plugin's discovery reads.
DISCOVERY: dict[str, dict[str, Any]] = {
    "/apis/resource.k8s.io": {"versions": [_version("resource.k8s.io", "v1")]},
    "/apis/resource.k8s.io/v1": {
        "resources": [{"name": n} for n in ("resourceslices", "resourceclaims", "devicetaintrules")]
    },
    "/apis/scheduling.k8s.io": {"versions": [_version("scheduling.k8s.io", "v1beta1")]},
    "/apis/scheduling.k8s.io/v1beta1": {"resources": [{"name": "podgroups"}]},
}


def _dry_run(body: Mapping[str, Any], keeps_combined: bool = False) -> RawAnswer:
    """A 1.35+ server: counters and devices in one slice are refused, the rest is kept
    (a 1.34 server, ``keeps_combined``, keeps them too)."""
    if not keeps_combined and "sharedCounters" in body["spec"] and body["spec"].get("devices"):
        return answer(422, {"message": "only one of sharedCounters or devices is allowed"})
    return answer(201, body)


class SliceApi(KubeClient):
    def __init__(self) -> None:
        super().__init__(Credentials("https://127.0.0.1:9"))
        self.down = False
        self.dry_run_keeps_combined = False  # the layout probe of a 1.34 server
        self.answers: list[Answer] = []
        self.slices: dict[str, dict[str, Any]] = {}
        self._lock = threading.Lock()

    def devices(self) -> list[str]:
        with self._lock:
            return [d["name"] for s in self.slices.values() for d in s["spec"]["devices"]]

    def send(self, method: str, path: str, **kw: Any) -> RawAnswer:
        if self.down:
            raise ApiUnreachable(method, path, self.server, ConnectionRefusedError(111, "refused"))
        for override in list(self.answers):
            got = override(method, path)
            if got is not None:
                return got
        if path == "/version":
            return answer(200, {"gitVersion": "v1.37.2"})
        if path in DISCOVERY:
            return answer(200, DISCOVERY[path])
        if path == SLICES and (kw.get("query") or {}).get("dryRun"):
            return _dry_run(kw["body"], self.dry_run_keeps_combined)
        if path.startswith("/api/v1/nodes/"):
            return answer(200, {"metadata": {"name": path.rsplit("/", 1)[1], "uid": "uid-1"}})
        if path.startswith(SLICES):
            return self._slices(method, path, kw.get("body"))
        return answer(404, {"message": f"no route {method} {path}"})

    def _slices(self, method: str, path: str, body: Mapping[str, Any] | None) -> RawAnswer:
        with self._lock:
            if method == "GET":
                return answer(200, {"items": list(self.slices.values())})
            if method == "DELETE":
                self.slices.pop(path.rsplit("/", 1)[1], None)
                return answer(200, {})
            stored = json.loads(json.dumps(body))
            stored["metadata"]["resourceVersion"] = "1"
            self.slices[stored["metadata"]["name"]] = stored
            return answer(201, stored)

    def watch(self, path: str, query: Mapping[str, str] | None = None, **kw: Any) -> Watch:
        raise ApiUnreachable("WATCH", path, self.server, ConnectionRefusedError(111, "no watch"))
