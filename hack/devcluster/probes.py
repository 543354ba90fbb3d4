"""Readiness probes: small HTTP(S) GETs with short timeouts."""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request
from collections.abc import Callable

from hack.devcluster.pki import Pki

_TIMEOUT_S = 2.0


def _get(url: str, context: ssl.SSLContext | None) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=_TIMEOUT_S, context=context) as resp:  # noqa: S310
            return int(resp.status), resp.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except (urllib.error.URLError, OSError):
        return 0, b""


def admin_context(pki: Pki) -> ssl.SSLContext:
    """TLS context that trusts the cluster CA and presents the admin certificate."""
    ctx = ssl.create_default_context(cafile=str(pki.ca_cert))
    ctx.load_cert_chain(str(pki.admin_cert), str(pki.admin_key))
    return ctx


def _self_signed_context() -> ssl.SSLContext:
    # Scheduler and controller manager serve /healthz with a certificate they
    # generate themselves at start; the probe only needs the status code.
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


def etcd_healthy(client_url: str) -> Callable[[], bool]:
    def probe() -> bool:
        code, body = _get(f"{client_url}/health", None)
        if code != 200:
            return False
        try:
            return bool(json.loads(body).get("health") == "true")
        except ValueError:
            return False

    return probe


def apiserver_ready(server: str, pki: Pki) -> Callable[[], bool]:
    ctx = admin_context(pki)

    def probe() -> bool:
        code, _ = _get(f"{server}/readyz", ctx)
        if code != 200:
            return False
        code, body = _get(f"{server}/apis/resource.k8s.io/v1", ctx)
        return code == 200 and b"resourceslices" in body

    return probe


def component_healthy(port: int, path: str) -> Callable[[], bool]:
    ctx = _self_signed_context()

    def probe() -> bool:
        code, _ = _get(f"https://127.0.0.1:{port}{path}", ctx)
        return code == 200

    return probe
