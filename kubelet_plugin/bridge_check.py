"""Start-up check of the extended-resource bridge against the node's device plugins."""

from __future__ import annotations

from collections.abc import Iterable

from driver.bridge import check_no_device_plugin
from driver.errors import ApiUnavailable, ConfigError, PermanentError
from driver.kube_http import ApiError, ApiUnreachable, KubeClient


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
