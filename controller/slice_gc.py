"""Clean-up of this driver's ResourceSlices whose node is gone.

A node's plugin deletes nothing once the node is removed, so its slices
would keep advertising devices the scheduler can never use. Each pass lists
the driver's slices and the nodes, and deletes the slices whose
``spec.nodeName`` names no node, with the slice's UID as a precondition so
a slice recreated in between is left alone. Slices without a node name
(network-attached pools) and slices of another driver are never touched. A list
answered without an ``items`` list (404 from a misrouted proxy, an empty body)
fails the pass: it is not read as "no nodes". Leadership is checked again before
each delete, so a replica that lost the lease mid-pass stops deleting.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from kubernetes import client

from controller.kube_client import ApiCallError, Json, request
from driver.errors import PermanentError
from driver.kube.client import RESOURCE_V1

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GcResult:
    deleted: tuple[str, ...]
    kept: int


def _all(api: client.ApiClient, what: str, path: str, query: dict[str, str]) -> list[Json]:
    items: list[Json] = []
    token = ""
    while True:
        page = request(
            api,
            what,
            "GET",
            path,
            query={**query, "limit": "500", **({"continue": token} if token else {})},
        )
        items.extend(_items(what, page))
        token = ((page or {}).get("metadata") or {}).get("continue") or ""
        if not token:
            return items


def _items(what: str, page: Json | None) -> list[Json]:
    """A page's items; a missing list is an error, never "nothing there"."""
    if page is None:
        raise PermanentError(f"{what}: not found (404): the list is not served at this path")
    items = page.get("items")
    if not isinstance(items, list):
        got = "missing" if items is None else f"a {type(items).__name__}"
        raise PermanentError(f"{what}: the answer's items is {got}, not a list")
    return items


def collect_orphaned_slices(
    api: client.ApiClient, driver_name: str, leading: Callable[[], bool] = lambda: True
) -> GcResult:
    """One pass; returns the names of the slices deleted. Stops once ``leading()`` is false."""
    slices = _all(
        api,
        f"list resourceslices of driver {driver_name}",
        f"{RESOURCE_V1}/resourceslices",
        {"fieldSelector": f"spec.driver={driver_name}"},
    )
    if not slices:
        return GcResult((), 0)
    nodes = {
        str((n.get("metadata") or {}).get("name"))
        for n in _all(api, "list nodes", "/api/v1/nodes", {})
    }
    deleted: list[str] = []
    for s in slices:
        meta: Json = s.get("metadata") or {}
        spec: Json = s.get("spec") or {}
        node = spec.get("nodeName")
        if spec.get("driver") != driver_name or not node or node in nodes:
            continue
        name = meta["name"]
        if not leading():
            log.warning("slice clean-up stopped, no longer the leader driver=%s", driver_name)
            break
        body = {"apiVersion": "v1", "kind": "DeleteOptions", "preconditions": {"uid": meta["uid"]}}
        try:
            request(
                api,
                f"delete resourceslice {name}",
                "DELETE",
                f"{RESOURCE_V1}/resourceslices/{name}",
                body=body,
            )
        except ApiCallError as e:
            if e.status == 409:  # replaced since the list: not ours to delete
                continue
            raise
        log.info(
            "orphaned resourceslice deleted slice=%s node=%s driver=%s", name, node, driver_name
        )
        deleted.append(name)
    return GcResult(tuple(deleted), len(slices) - len(deleted))
