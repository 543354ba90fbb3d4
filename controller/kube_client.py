"""Kubernetes API access for the cluster-facing commands.

Requests and answers are plain JSON, so fields the generated client models
lag behind on are never lost. Errors become the
project's error tree: an unreachable API server is :class:`ApiUnavailable`, a
refusal, or an answer that is not a JSON object (a proxy's page), is
:class:`ApiCallError` naming the object.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from typing import Any

import urllib3
from kubernetes import client

from driver.errors import ApiUnavailable, PermanentError
from driver.flags import add_flag
from driver.kube.client import send
from driver.kube.features import served_resources, taint_rule_version

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


def request(
    api: client.ApiClient,
    what: str,
    method: str,
    path: str,
    *,
    body: Json | None = None,
    query: Mapping[str, str] | None = None,
    timeout_s: float = 30.0,
) -> Json | None:
    """Send ``method path`` with a JSON body; the JSON answer, or None when ``what`` is absent."""
    try:
        answer = send(api, method, path, body=body, query=query, timeout_s=timeout_s)
    except (urllib3.exceptions.HTTPError, OSError) as e:
        raise ApiUnavailable(f"{what}: the API server cannot be reached: {e}") from e
    if answer.status == 404:
        return None
    if not answer.ok:
        raise ApiCallError(
            f"{what}: {answer.status} {answer.reason}: {answer.message()}", answer.status
        )
    try:
        return answer.json()
    except ValueError as e:
        raise ApiCallError(f"{what}: the answer is not JSON ({e})", answer.status) from e


GROUP_PATH = "/apis/resource.k8s.io"


def taint_rules_version(api: client.ApiClient) -> tuple[str | None, list[str]]:
    """The newest ``resource.k8s.io`` version serving DeviceTaintRule (None when none does),
    and every version served (discovery)."""
    group = request(api, "API group resource.k8s.io", "GET", GROUP_PATH) or {}
    docs = {
        str(v["version"]): request(
            api, f"resource.k8s.io/{v['version']}", "GET", f"{GROUP_PATH}/{v['version']}"
        )
        or {}
        for v in group.get("versions", ())
    }
    return taint_rule_version(served_resources(docs)), sorted(docs)


def taint_rules_path(version: str) -> str:
    return f"{GROUP_PATH}/{version}/devicetaintrules"
