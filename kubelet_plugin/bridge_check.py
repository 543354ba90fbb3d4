"""Start-up check of the extended-resource bridge against the node's device plugins."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

import urllib3
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from driver.bridge import check_no_device_plugin
from driver.errors import ApiUnavailable, ConfigError, PermanentError


def check_node(
    api: client.ApiClient, node_name: str, resources: Iterable[str] | None = None
) -> None:
    """Read Node ``node_name`` and refuse (``DevicePluginConflict``) if a device plugin
    advertises a legacy resource there. ``ConfigError`` if the node does not exist,
    ``ApiUnavailable`` if the API server cannot be reached."""
    try:
        resp: Any = client.CoreV1Api(api).read_node(node_name, _preload_content=False)
    except ApiException as e:
        if e.status == 404:
            raise ConfigError(f"--node-name: node {node_name!r} does not exist") from e
        if e.status in (401, 403):
            raise PermanentError(
                f"read node {node_name}: {e.status} {e.reason}: the plugin's service account "
                "needs get on nodes for the bridge check"
            ) from e
        raise ApiUnavailable(f"read node {node_name}: {e.status} {e.reason}") from e
    except (urllib3.exceptions.HTTPError, OSError) as e:
        raise ApiUnavailable(f"read node {node_name}: the API server cannot be reached: {e}") from e
    node: dict[str, Any] = json.loads(resp.data)
    check_no_device_plugin(node, resources)
