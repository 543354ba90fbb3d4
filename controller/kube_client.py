"""Kubernetes API access for the cluster-facing commands.

Requests and answers are plain JSON, so fields the generated client models
lag behind on are never lost. Errors become the
project's error tree: an unreachable API server is :class:`ApiUnavailable`, a
refusal is :class:`ApiCallError` naming the object.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Mapping
from typing import Any, cast

import urllib3
from kubernetes import client, config

from driver.errors import ApiUnavailable, ConfigError, PermanentError
from driver.flags import add_flag

Json = dict[str, Any]


class ApiCallError(PermanentError):
    """The API server answered with an error (forbidden, invalid, conflict...)."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


def add_kubeconfig_flag(
    parser: argparse.ArgumentParser, env: Mapping[str, str] | None = None
) -> None:
    environ = os.environ if env is None else env
    add_flag(
        parser,
        "--kubeconfig",
        "kubeconfig file of the cluster (also read from KUBECONFIG; default: in-cluster, "
        "then ~/.kube/config)",
        default=environ.get("KUBECONFIG") or None,
        env=env,
    )


def api_client(kubeconfig: str | None) -> client.ApiClient:
    """An API client for ``kubeconfig``, or the in-cluster service account without one."""
    if kubeconfig:
        if not os.path.exists(kubeconfig):  # noqa: PTH110 (a str path from a flag)
            raise ConfigError(f"--kubeconfig: file {kubeconfig!r} does not exist")
        return cast(client.ApiClient, config.new_client_from_config(config_file=kubeconfig))  # type: ignore[no-untyped-call]
    if os.environ.get("KUBERNETES_SERVICE_HOST"):
        cfg = client.Configuration()
        config.load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
        return client.ApiClient(cfg)
    return cast(client.ApiClient, config.new_client_from_config())  # type: ignore[no-untyped-call]


RESOURCE_V1 = "/apis/resource.k8s.io/v1"


def request(
    api: client.ApiClient,
    what: str,
    method: str,
    path: str,
    *,
    body: Json | None = None,
    query: Mapping[str, str] | None = None,
) -> Json | None:
    """Send ``method path`` with a JSON body; the JSON answer, or None when ``what`` is absent."""
    try:
        method, url, headers, data, _ = api.param_serialize(
            method,
            path,
            query_params=list((query or {}).items()),
            header_params={"Accept": "application/json", "Content-Type": "application/json"},
            body=body,
            auth_settings=["BearerToken"],
        )
        resp = api.call_api(method, url, header_params=headers, body=data, _request_timeout=30)
        raw: bytes = resp.read()  # type: ignore[no-untyped-call]
    except (urllib3.exceptions.HTTPError, OSError) as e:
        raise ApiUnavailable(f"{what}: the API server cannot be reached: {e}") from e
    if resp.status == 404:
        return None
    if not 200 <= resp.status <= 299:
        raise ApiCallError(f"{what}: {resp.status} {resp.reason}: {_message(raw)}", resp.status)
    parsed: Json = json.loads(raw) if raw else {}
    return parsed


def _message(body: object) -> str:
    if isinstance(body, bytes | str):
        try:
            doc = json.loads(body)
        except ValueError:
            return str(body)[:300]
        if isinstance(doc, dict) and "message" in doc:
            return str(doc["message"])
    return str(body)[:300]
