"""Kubernetes API access through the generated ``kubernetes`` client, for the controller,
the CLI and developer tooling: building a client, raw JSON requests.

The kubelet plugin uses :mod:`driver.kube.http` instead (no ``kubernetes`` import); both
pick the kubeconfig by the same rule (:func:`driver.kube.kubeconfig.choose`).
"""

from __future__ import annotations

import ssl
from collections.abc import Mapping
from pathlib import Path
from typing import cast
from urllib.parse import urlsplit

from kubernetes import client, config

from driver.errors import ConfigError
from driver.kube.http import RESOURCE_V1, RawAnswer
from driver.kube.kubeconfig import Choice, choose, unusable

__all__ = ["RESOURCE_V1", "RawAnswer", "api_client", "send"]


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
    choice = choose(kubeconfig, flag=flag, environ=environ)
    if choice.path is None:
        cfg = client.Configuration()
        try:
            config.load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
        except (config.ConfigException, OSError) as e:
            raise ConfigError(f"{choice.where}: cannot build a Kubernetes client: {e}") from e
        return _checked(client.ApiClient(cfg), choice)
    return _checked(_from_file(choice.path, choice.where), choice)


def _checked(api: client.ApiClient, choice: Choice) -> client.ApiClient:
    """``api`` once its server is a URL and its CA, client certificate and key load: the
    kubernetes client would find out only at its first request, and call the API server
    unreachable. ConfigError naming the kubeconfig and the field."""
    cfg = api.configuration
    try:
        if urlsplit(cfg.host).scheme not in ("http", "https"):
            raise ValueError(f"server {cfg.host!r} is not an http(s)://HOST[:PORT] URL")
        _load_tls(cfg)
    except (ValueError, OSError) as e:  # ssl.SSLError is an OSError
        api.close()  # type: ignore[no-untyped-call]
        raise ConfigError(unusable(choice, e)) from e
    return api


def _load_tls(cfg: client.Configuration) -> None:
    """Load the CA, client certificate and key of ``cfg`` as its requests will; ValueError
    naming the kubeconfig's fields (the client keeps their data in files of its own)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    try:
        if cfg.ssl_ca_cert:
            ctx.load_verify_locations(cfg.ssl_ca_cert)
    except OSError as e:
        raise ValueError(
            f"certificate-authority(-data): not a readable PEM CA certificate: {e}"
        ) from e
    if cfg.cert_file and cfg.key_file:
        try:
            ctx.load_cert_chain(cfg.cert_file, cfg.key_file)
        except OSError as e:
            raise ValueError(
                "client-certificate(-data) and client-key(-data): "
                f"not a readable PEM certificate and key: {e}"
            ) from e


def _from_file(path: str, where: str) -> client.ApiClient:
    try:
        return cast(
            client.ApiClient,
            config.new_client_from_config(config_file=path),  # type: ignore[no-untyped-call]
        )
    except (config.ConfigException, OSError) as e:
        raise ConfigError(f"{where}: cannot build a Kubernetes client: {e}") from e


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
