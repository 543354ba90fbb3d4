"""The admin kubeconfig, the scheduler's configuration file, and API clients."""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path

import yaml
from kubernetes import client

from hack.devcluster.pki import Pki

CONTEXT = "tranche-dev"


def _b64(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()


def _write_private(path: Path, text: str) -> None:
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    tmp.replace(path)


def write_kubeconfig(path: Path, server: str, pki: Pki) -> None:
    """An admin kubeconfig with the certificates embedded, so it can be copied.

    Written as JSON (which every kubeconfig reader takes as YAML): the plugins started with
    it then read it without the YAML parser, as an installed plugin reading its service
    account does (:mod:`driver.json_or_yaml`), so the benchmarks measure that memory."""
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": CONTEXT,
                "cluster": {
                    "server": server,
                    "certificate-authority-data": _b64(pki.ca_cert),
                },
            }
        ],
        "users": [
            {
                "name": "admin",
                "user": {
                    "client-certificate-data": _b64(pki.admin_cert),
                    "client-key-data": _b64(pki.admin_key),
                },
            }
        ],
        "contexts": [{"name": CONTEXT, "context": {"cluster": CONTEXT, "user": "admin"}}],
        "current-context": CONTEXT,
    }
    _write_private(path, json.dumps(doc, indent=2) + "\n")


def write_scheduler_config(path: Path, kubeconfig: Path) -> None:
    doc = {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "clientConnection": {"kubeconfig": str(kubeconfig)},
        "leaderElection": {"leaderElect": False},
    }
    path.write_text(yaml.safe_dump(doc, sort_keys=False))


def api_client(server: str, pki: Pki) -> client.ApiClient:
    """A ``kubernetes`` client authenticated as the admin user."""
    conf = client.Configuration()
    conf.host = server
    conf.ssl_ca_cert = str(pki.ca_cert)
    conf.cert_file = str(pki.admin_cert)
    conf.key_file = str(pki.admin_key)
    conf.verify_ssl = True
    return client.ApiClient(conf)
