"""Where a process finds the Kubernetes API server and its credentials.

One rule for every command: the file given by the flag (``--kubeconfig``); without
one, the pod's service account when running in a cluster (``KUBERNETES_SERVICE_HOST``
set); else ``$KUBECONFIG`` or ``~/.kube/config``. A kubeconfig is read at its current
context: the cluster's server, CA (data or file), ``insecure-skip-tls-verify`` and
``tls-server-name``; the user's client certificate and key (data or file) and bearer
token (inline or ``tokenFile``). Relative file names are relative to the kubeconfig.
Credential plugins (``exec``, ``auth-provider``) and basic auth are refused by name.
Every failure is a :class:`ConfigError` naming the flag or the file.
"""

from __future__ import annotations

import base64
import binascii
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from driver.errors import ConfigError
from driver.json_or_yaml import parse_json_or_yaml

DEFAULT_KUBECONFIG = "~/.kube/config"
SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
IN_CLUSTER = "in-cluster configuration"


@dataclass(frozen=True)
class Credentials:
    """How to reach and authenticate to one API server. PEM data is text; files are paths."""

    server: str
    ca_data: str | None = None
    ca_file: str | None = None
    cert_data: str | None = None
    cert_file: str | None = None
    key_data: str | None = None
    key_file: str | None = None
    token: str | None = None
    token_file: str | None = None
    insecure: bool = False
    tls_server_name: str | None = None


@dataclass(frozen=True)
class Choice:
    """The kubeconfig file to read (``None``: the in-cluster service account) and how
    errors name it."""

    path: str | None
    where: str


def choose(
    kubeconfig: str | Path | None, *, flag: str, environ: Mapping[str, str] | None = None
) -> Choice:
    """Apply the selection rule; a named file that does not exist is a ConfigError."""
    env = os.environ if environ is None else environ
    if kubeconfig:
        path = str(kubeconfig)
        if not Path(path).exists():
            raise ConfigError(f"{flag}: file {path!r} does not exist")
        return Choice(path, f"{flag} {path}")
    if env.get("KUBERNETES_SERVICE_HOST"):
        return Choice(None, IN_CLUSTER)
    default = env.get("KUBECONFIG") or DEFAULT_KUBECONFIG
    return Choice(
        str(Path(default).expanduser()),
        f"no {flag}, not in a cluster, and the default kubeconfig {default}",
    )


def load(
    kubeconfig: str | Path | None,
    *,
    flag: str = "--kubeconfig",
    environ: Mapping[str, str] | None = None,
    service_account_dir: Path = SERVICE_ACCOUNT_DIR,
) -> Credentials:
    """The credentials the selection rule picks (see the module docstring)."""
    env = os.environ if environ is None else environ
    return read(choose(kubeconfig, flag=flag, environ=env), env, service_account_dir)


def read(
    choice: Choice, environ: Mapping[str, str], service_account_dir: Path = SERVICE_ACCOUNT_DIR
) -> Credentials:
    """The credentials of ``choice``; a ConfigError naming it when they cannot be read."""
    try:
        if choice.path is None:
            return in_cluster(environ, service_account_dir)
        return from_file(Path(choice.path))
    except (ValueError, OSError) as e:
        raise ConfigError(unusable(choice, e)) from e


def unusable(choice: Choice, error: Exception) -> str:
    """The message of a ConfigError for a kubeconfig (or the in-cluster configuration) that
    cannot give a client."""
    return f"{choice.where}: cannot build a Kubernetes client: {error}"


def in_cluster(environ: Mapping[str, str], service_account_dir: Path) -> Credentials:
    """The pod's service account; ValueError when a variable or file is missing."""
    host = environ.get("KUBERNETES_SERVICE_HOST", "")
    port = environ.get("KUBERNETES_SERVICE_PORT", "")
    if not host or not port:
        raise ValueError("KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT must both be set")
    token, ca = service_account_dir / "token", service_account_dir / "ca.crt"
    for f in (token, ca):
        if not f.is_file():
            raise ValueError(f"service account file {f} does not exist")
    if not token.read_text().strip():
        raise ValueError(f"service account token file {token} is empty")
    host = f"[{host}]" if ":" in host else host
    return Credentials(f"https://{host}:{port}", ca_file=str(ca), token_file=str(token))


def from_file(path: Path) -> Credentials:
    """The credentials of the current context of the kubeconfig at ``path``."""
    doc = parse_json_or_yaml(path.read_text())
    if not isinstance(doc, dict):
        raise ValueError("not a kubeconfig (expected a YAML mapping)")
    current = doc.get("current-context")
    if not current:
        raise ValueError("current-context is not set")
    context = _named(doc, "contexts", "context", str(current))
    cluster = _named(doc, "clusters", "cluster", str(context.get("cluster", "")))
    user_name = context.get("user")
    user = _named(doc, "users", "user", str(user_name)) if user_name else {}
    server = cluster.get("server")
    if not server:
        raise ValueError(f"cluster {context.get('cluster')!r} has no server")
    for unsupported in ("exec", "auth-provider", "username"):
        if unsupported in user:
            raise ValueError(
                f"user {user_name!r}: {unsupported} credentials are not supported; "
                "use a client certificate or a bearer token"
            )
    base = path.parent
    return Credentials(
        server=str(server).rstrip("/"),
        ca_data=_data(cluster, "certificate-authority-data"),
        ca_file=_file(cluster, "certificate-authority", base),
        cert_data=_data(user, "client-certificate-data"),
        cert_file=_file(user, "client-certificate", base),
        key_data=_data(user, "client-key-data"),
        key_file=_file(user, "client-key", base),
        token=str(user["token"]) if user.get("token") else None,
        token_file=_file(user, "tokenFile", base),
        insecure=bool(cluster.get("insecure-skip-tls-verify", False)),
        tls_server_name=str(cluster["tls-server-name"]) if cluster.get("tls-server-name") else None,
    )


def _named(doc: Mapping[str, Any], section: str, key: str, name: str) -> dict[str, Any]:
    for entry in doc.get(section) or []:
        if isinstance(entry, dict) and entry.get("name") == name:
            body = entry.get(key) or {}
            if not isinstance(body, dict):
                raise ValueError(f"{section} entry {name!r}: {key} must be a mapping")
            return body
    raise ValueError(f"{key} {name!r} is not in {section}")


def _data(section: Mapping[str, Any], field: str) -> str | None:
    value = section.get(field)
    if not value:
        return None
    try:
        return base64.b64decode(str(value), validate=True).decode()
    except (binascii.Error, UnicodeDecodeError) as e:
        raise ValueError(f"{field} is not base64-encoded PEM: {e}") from e


def _file(section: Mapping[str, Any], field: str, base: Path) -> str | None:
    value = section.get(field)
    if not value:
        return None
    path = Path(str(value)).expanduser()
    return str(path if path.is_absolute() else base / path)
