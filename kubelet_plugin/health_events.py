"""Device health changes as Events on the Node.

:class:`HealthEvents` is a :class:`driver.health.monitor.HealthMonitor` listener. The
monitor calls listeners under its lock, so it only hands the change to the
:class:`~kubelet_plugin.event_recorder.EventRecorder`, which queues it: health
never waits for the API server.
"""

from __future__ import annotations

from driver.health.monitor import HealthChange
from kubelet_plugin.event_recorder import EventRecorder, EventType, ObjectRef

REASONS: dict[str, tuple[EventType, str]] = {
    "tainted": ("Warning", "DeviceTainted"),
    "escalated": ("Warning", "DeviceTaintEscalated"),
    "repeated": ("Warning", "DeviceFaultRepeated"),
    "healed": ("Normal", "DeviceHealed"),
}
_VERBS = {
    "tainted": "tainted",
    "escalated": "taint escalated",
    "repeated": "fault repeated",
    "healed": "healed",
}


def describe(change: HealthChange) -> str:
    """``device gpu-1a2b3c4d (and 18 more on GPU-...) on node n1 tainted: XID 79 ...``."""
    if change.devices:
        first = change.devices[0]
        more = len(change.devices) - 1
        what = f"device {first}" + (f" (and {more} more on {change.gpu_uuid})" if more else "")
    else:
        what = f"GPU {change.gpu_uuid}"
    taint = change.key + (f"={change.value}" if change.value else "") + f":{change.effect}"
    return f"{what} on node {change.node} {_VERBS[change.kind]}: {change.message} ({taint})"


class HealthEvents:
    """Records one Event on the change's Node for each health change."""

    def __init__(self, recorder: EventRecorder) -> None:
        self._recorder = recorder

    def __call__(self, change: HealthChange) -> None:
        event_type, reason = REASONS[change.kind]
        self._recorder.record(ObjectRef.node(change.node), event_type, reason, describe(change))
