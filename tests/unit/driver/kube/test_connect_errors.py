"""A kubeconfig whose server, CA, client certificate or key cannot give a client stops
``KubeClient.connect`` (the plugin's client) with a ConfigError naming the flag, the file and
the field, never a raw ValueError, OSError or ssl.SSLError; ``api_client`` (the controller's
and the CLI's) refuses it as it is built, not at its first request as an unreachable server."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest

from driver.errors import ConfigError
from driver.kube.client import api_client
from driver.kube.http import KubeClient

NOT_A_CERTIFICATE = "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def kubeconfig(tmp_path: Path, cluster: dict[str, Any], user: dict[str, Any]) -> Path:
    path = tmp_path / "kubeconfig"
    path.write_text(
        json.dumps(
            {
                "current-context": "c",
                "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}],
                "clusters": [{"name": "k", "cluster": cluster}],
                "users": [{"name": "u", "user": user}],
            }
        )
    )
    return path


HTTPS = "https://10.0.0.1:6443"
INSECURE = {"server": HTTPS, "insecure-skip-tls-verify": True}


@pytest.mark.parametrize(
    ("cluster", "user", "says"),
    [
        (
            {"server": "10.0.0.1:6443"},
            {"token": "t"},
            "server '10.0.0.1:6443' is not an http(s)://HOST[:PORT] URL",
        ),
        ({"server": "https://10.0.0.1:99999"}, {"token": "t"}, "server 'https://10.0.0.1:99999'"),
        (
            {"server": HTTPS, "certificate-authority": "/nonexistent/ca.crt"},
            {"token": "t"},
            "certificate-authority /nonexistent/ca.crt: not a readable PEM CA certificate: "
            "No such file or directory",
        ),
        (
            {"server": HTTPS, "certificate-authority-data": b64(NOT_A_CERTIFICATE)},
            {"token": "t"},
            "certificate-authority-data: not a readable PEM CA certificate",
        ),
        (
            INSECURE,
            {"client-certificate-data": b64("nope"), "client-key-data": b64("nope")},
            "client-certificate-data and client-key-data: not a readable PEM certificate and key",
        ),
        (
            INSECURE,
            {"client-certificate": "/nonexistent/me.crt", "client-key": "/nonexistent/me.key"},
            "client-certificate /nonexistent/me.crt and client-key /nonexistent/me.key: "
            "not a readable PEM certificate and key: No such file or directory",
        ),
    ],
)
def test_a_client_that_cannot_be_built_names_the_kubeconfig_and_the_field(
    tmp_path: Path, cluster: dict[str, Any], user: dict[str, Any], says: str
) -> None:
    path = kubeconfig(tmp_path, cluster, user)
    with pytest.raises(ConfigError) as caught:
        KubeClient.connect(path, environ={})
    assert str(caught.value).startswith(
        f"--kubeconfig {path}: cannot build a Kubernetes client: {says}"
    )


@pytest.mark.parametrize(
    ("cluster", "user", "says"),
    [
        (
            {"server": "10.0.0.1:6443"},
            {"token": "t"},
            "server '10.0.0.1:6443' is not an http(s)://HOST[:PORT] URL",
        ),
        (
            {"server": HTTPS, "certificate-authority-data": b64(NOT_A_CERTIFICATE)},
            {"token": "t"},
            "certificate-authority(-data): not a readable PEM CA certificate",
        ),
        (
            INSECURE,
            {"client-certificate-data": b64("nope"), "client-key-data": b64("nope")},
            "client-certificate(-data) and client-key(-data): "
            "not a readable PEM certificate and key",
        ),
    ],
)
def test_the_kubernetes_client_is_refused_as_it_is_built_naming_the_field(
    tmp_path: Path, cluster: dict[str, Any], user: dict[str, Any], says: str
) -> None:
    path = kubeconfig(tmp_path, cluster, user)
    with pytest.raises(ConfigError) as caught:
        api_client(path, environ={})
    assert str(caught.value).startswith(
        f"--kubeconfig {path}: cannot build a Kubernetes client: {says}"
    )
