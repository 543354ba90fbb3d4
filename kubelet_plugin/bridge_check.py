"""Start-up check of the extended-resource bridge against the node's device plugins."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable

from driver.devices.bridge import check_no_device_plugin
from driver.errors import ApiUnavailable, ConfigError, PermanentError
from driver.kube.http import ApiError, ApiUnreachable, KubeClient

log = logging.getLogger(__name__)


def check_node(kube: KubeClient, node_name: str, resources: Iterable[str] | None = None) -> None:
    """Read Node ``node_name`` and refuse (``DevicePluginConflict``) if a device plugin
    advertises a legacy resource there. ``ConfigError`` if the node does not exist,
    ``ApiUnavailable`` if the API server cannot be reached."""
    try:
        node = kube.request("GET", f"/api/v1/nodes/{node_name}", timeout_s=30.0)
    except ApiError as e:
        if e.status == 404:
            raise ConfigError(f"--node-name: node {node_name!r} does not exist") from e
        if e.status in (401, 403):
            raise PermanentError(
                f"read node {node_name}: {e.status} {e.reason}: the plugin's service account "
                "needs get on nodes for the bridge check"
            ) from e
        raise ApiUnavailable(f"read node {node_name}: {e.status} {e.reason}") from e
    except ApiUnreachable as e:
        raise ApiUnavailable(
            f"read node {node_name}: the API server cannot be reached: {e.detail}"
        ) from e
    except ValueError as e:
        raise ApiUnavailable(f"read node {node_name}: the API server sent invalid JSON: {e}") from e
    check_no_device_plugin(node, resources)


def check_node_when_reachable(
    check: Callable[[], None],
    stop: threading.Event,
    *,
    initial_s: float = 0.5,
    cap_s: float = 30.0,
) -> bool:
    """Run ``check`` until the API server answers it; False if ``stop`` is set first.

    An API server that is down at start must not crash-loop the plugin: the check
    waits for it, with back-off, and any answer (a conflict included) ends the wait.
    """
    delay = initial_s
    while not stop.is_set():
        try:
            check()
            return True
        except ApiUnavailable as e:
            log.warning(
                "device plugin check waits for the API server retry_s=%.1f error=%s", delay, e
            )
        if stop.wait(delay):
            break
        delay = min(delay * 2, cap_s)
    return False
