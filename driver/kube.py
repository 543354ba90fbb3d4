"""Kubernetes API access shared by every command: building a client, raw JSON requests."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from kubernetes import client, config

from driver.errors import ConfigError

DEFAULT_KUBECONFIG = "~/.kube/config"
RESOURCE_V1 = "/apis/resource.k8s.io/v1"


def api_client(
    kubeconfig: str | Path | None,
    *,
    flag: str = "--kubeconfig",
    environ: Mapping[str, str] | None = None,
) -> client.ApiClient:
    """A client for ``kubeconfig``; without one, the in-cluster service account inside a
    pod (``KUBERNETES_SERVICE_HOST`` set), else ``$KUBECONFIG`` or ``~/.kube/config``.

    A missing or unusable file is a :class:`ConfigError` naming ``flag`` and the file.
    """
    env = os.environ if environ is None else environ
    if kubeconfig:
        path = str(kubeconfig)
        if not Path(path).exists():
            raise ConfigError(f"{flag}: file {path!r} does not exist")
        return _from_file(path, f"{flag} {path}")
    if env.get("KUBERNETES_SERVICE_HOST"):
        cfg = client.Configuration()
        try:
            config.load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
        except (config.ConfigException, OSError) as e:
            raise ConfigError(
                f"in-cluster configuration: cannot build a Kubernetes client: {e}"
            ) from e
        return client.ApiClient(cfg)
    default = env.get("KUBECONFIG") or DEFAULT_KUBECONFIG
    return _from_file(default, f"no {flag}, not in a cluster, and the default kubeconfig {default}")


def _from_file(path: str, where: str) -> client.ApiClient:
    try:
        return cast(
            client.ApiClient,
            config.new_client_from_config(config_file=path),  # type: ignore[no-untyped-call]
        )
    except (config.ConfigException, OSError) as e:
        raise ConfigError(f"{where}: cannot build a Kubernetes client: {e}") from e


@dataclass(frozen=True)
class RawAnswer:
    """The API server's answer to one request, undecoded."""

    status: int
    reason: str
    body: bytes

    @property
    def ok(self) -> bool:
        return 200 <= self.status <= 299

    def json(self) -> dict[str, Any]:
        """The body as a JSON object (``{}`` when empty); ValueError when it is not one."""
        doc = json.loads(self.body) if self.body else {}
        if not isinstance(doc, dict):
            raise ValueError(f"expected a JSON object, got {type(doc).__name__}")
        return doc

    def message(self) -> str:
        """The ``message`` of a ``Status`` answer, else the start of the body."""
        with contextlib.suppress(ValueError, LookupError, TypeError):
            return str(json.loads(self.body)["message"])
        return self.body.decode(errors="replace")[:300]


def send(
    api: client.ApiClient,
    method: str,
    path: str,
    *,
    body: object = None,
    query: Mapping[str, str] | None = None,
    content_type: str = "application/json",
    timeout_s: float = 30.0,
) -> RawAnswer:
    """One request with a JSON body, answered as raw bytes, so fields the generated client
    models lag behind on are never lost. Transport failures (``urllib3`` errors,
    ``OSError``) propagate; every HTTP status comes back as an answer."""
    method, url, headers, data, _ = api.param_serialize(
        method,
        path,
        query_params=list((query or {}).items()),
        header_params={"Accept": "application/json", "Content-Type": content_type},
        body=body,
        auth_settings=["BearerToken"],
    )
    resp = api.call_api(method, url, header_params=headers, body=data, _request_timeout=timeout_s)
    raw: bytes = resp.read()  # type: ignore[no-untyped-call]
    return RawAnswer(resp.status, str(resp.reason or ""), raw)
