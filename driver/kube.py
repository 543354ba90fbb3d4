"""Building a Kubernetes API client, shared by every command."""

from __future__ import annotations

from pathlib import Path
from typing import cast

from kubernetes import client, config

from driver.errors import ConfigError


def api_client(kubeconfig: str | Path | None) -> client.ApiClient:
    """A client for ``kubeconfig``; without one, the in-cluster service account."""
    try:
        if kubeconfig:
            return cast(
                client.ApiClient,
                config.new_client_from_config(config_file=str(kubeconfig)),  # type: ignore[no-untyped-call]
            )
        config.load_incluster_config()  # type: ignore[no-untyped-call]
        return client.ApiClient()
    except (config.ConfigException, OSError) as e:
        where = f"--kubeconfig {kubeconfig}" if kubeconfig else "in-cluster configuration"
        raise ConfigError(f"{where}: cannot build a Kubernetes client: {e}") from e
