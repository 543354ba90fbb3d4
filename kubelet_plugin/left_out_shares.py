"""Share devices left out of the slices to stay within the API server's limits, reported.

On Kubernetes 1.34 a GPU's slice holds at most 1024 counters consumed by its devices
(:mod:`driver.devices.slice_fit`); the sharing groups that do not fit are not published.
:class:`LeftOutShares` tells once per change, for each GPU whose left-out groups changed: a
warning log line and a Warning Event on the Node (``SharesNotPublished``), or, once they fit
again, an info line and a Normal Event (``SharesPublished``). The gauge
``tranche_unpublished_share_devices`` holds the count now.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from driver.devices.slice_fit import sharing_group
from kubelet_plugin.event_recorder import EventType

log = logging.getLogger(__name__)

NodeEvent = Callable[[EventType, str, str], None]


class LeftOutShares:
    """Compares each build's left-out groups (GPU name → groups) with the last one's."""

    def __init__(self, node: str, node_event: NodeEvent) -> None:
        self._node = node
        self._node_event = node_event
        self._last: dict[str, tuple[str, ...]] = {}

    def update(
        self,
        extra_devices: Mapping[str, Sequence[Mapping[str, Any]]],
        left_out: Mapping[str, tuple[str, ...]],
        limit: int | None,
    ) -> int:
        """Report what changed since the last build; the number of share devices (of
        ``extra_devices``, GPU name → devices) in the ``left_out`` groups."""
        for gpu in sorted(set(left_out) | set(self._last)):
            groups = left_out.get(gpu, ())
            if groups == self._last.get(gpu, ()):
                continue
            if groups:
                message = (
                    f"GPU {gpu} on node {self._node}: share devices of sharing groups "
                    f"{', '.join(groups)} are not published: the GPU's ResourceSlice would "
                    f"exceed the API server's per-slice limits ({limit} counters consumed, "
                    "128 devices; Kubernetes 1.34); fewer sharing groups or MIG profiles, "
                    "or Kubernetes 1.35, make room"
                )
                log.warning(
                    "share devices left out node=%s gpu=%s groups=%s limit=%s",
                    self._node,
                    gpu,
                    ",".join(groups),
                    limit,
                    extra={"node": self._node, "gpu": gpu},
                )
                self._node_event("Warning", "SharesNotPublished", message)
            else:
                log.info("share devices published again node=%s gpu=%s", self._node, gpu)
                self._node_event(
                    "Normal",
                    "SharesPublished",
                    f"GPU {gpu} on node {self._node}: every sharing group's share devices "
                    "are published again",
                )
        self._last = dict(left_out)
        return sum(
            1
            for gpu, devices in extra_devices.items()
            for d in devices
            if sharing_group(d) in left_out.get(gpu, ())
        )
