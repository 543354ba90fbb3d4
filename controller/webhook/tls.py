"""The webhook TLS Secret on the API server, caBundle patching, and the live SSL context.

:class:`WebhookTls` keeps the serving certificate of this replica in step with
the Secret. Every replica reads it; only the leader (``may_write``) creates or
renews it and patches ``caBundle`` into the webhook configurations.
"""

from __future__ import annotations

import base64
import datetime as dt
import logging
import os
import ssl
import tempfile
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from kubernetes import client

from controller.kube_client import ApiCallError, Json, request
from controller.webhook.certs import CertPolicy, TlsBundle, rotate, rotation_reason

log = logging.getLogger(__name__)


def server_context(bundle: TlsBundle) -> ssl.SSLContext:
    """A TLS server context serving ``bundle``'s certificate and key.

    ``load_cert_chain`` reads only files. The controller runs with a read-only root file system
    and no writable volume, so the PEM goes to anonymous in-memory files (``memfd_create``) that
    are closed at once: nothing is written to any directory, ``$TMPDIR`` included. Only where
    the platform has no memfd does it fall back to a private temporary directory.
    """
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    if hasattr(os, "memfd_create"):
        cert_fd = os.memfd_create("tranche-tls-crt")
        key_fd = os.memfd_create("tranche-tls-key")
        try:
            os.write(cert_fd, bundle.cert)
            os.write(key_fd, bundle.key)
            ctx.load_cert_chain(f"/proc/self/fd/{cert_fd}", f"/proc/self/fd/{key_fd}")
        finally:
            os.close(cert_fd)
            os.close(key_fd)
        return ctx
    with tempfile.TemporaryDirectory(prefix="tranche-tls-") as tmp:
        cert, key = Path(tmp) / "tls.crt", Path(tmp) / "tls.key"
        cert.write_bytes(bundle.cert)
        fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(bundle.key)
        ctx.load_cert_chain(cert, key)
    return ctx


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


class WebhookTls:
    """The webhook certificate of one controller replica."""

    def __init__(
        self,
        api: client.ApiClient,
        namespace: str,
        secret_name: str,
        *,
        webhook_configs: Sequence[str],
        policy: CertPolicy,
        clock: Callable[[], dt.datetime] = _now,
    ) -> None:
        self._api = api
        self._namespace = namespace
        self._secret = secret_name
        self._configs = tuple(webhook_configs)
        self._policy = policy
        self._clock = clock
        self._lock = threading.Lock()
        self._bundle: TlsBundle | None = None
        self._context: ssl.SSLContext | None = None

    @property
    def bundle(self) -> TlsBundle | None:
        with self._lock:
            return self._bundle

    def context(self) -> ssl.SSLContext | None:
        """The SSL context for new connections; None until a certificate is loaded."""
        with self._lock:
            return self._context

    def sync(self, may_write: bool) -> str:
        """Load the Secret; as leader, create or renew it and patch caBundle.

        Returns what was done: ``current``, ``rotated: <reason>`` or
        ``waiting for the leader`` (no usable Secret yet and not the leader).
        """
        what = f"secret {self._namespace}/{self._secret}"
        got = request(self._api, f"read {what}", "GET", self._secret_path())
        bundle = TlsBundle.from_secret_data((got or {}).get("data") or {}) if got else None
        reason = rotation_reason(bundle, self._policy, self._clock())
        outcome = "current"
        if reason and may_write:
            bundle = rotate(bundle, self._policy, self._clock())
            self._write(got, bundle)
            log.info("webhook certificate rotated secret=%s reason=%r", what, reason)
            outcome = f"rotated: {reason}"
        if bundle is None:
            return "waiting for the leader"
        if may_write:
            self.patch_ca_bundle(bundle.ca_bundle)
        self._install(bundle)
        return outcome

    def _write(self, existing: Json | None, bundle: TlsBundle) -> None:
        body: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Secret",
            "type": "kubernetes.io/tls",
            "metadata": {
                "name": self._secret,
                "namespace": self._namespace,
                "labels": {"app.kubernetes.io/part-of": "tranche"},
            },
            "data": bundle.secret_data(),
        }
        what = f"secret {self._namespace}/{self._secret}"
        if existing is None:
            path = f"/api/v1/namespaces/{self._namespace}/secrets"
            request(self._api, f"create {what}", "POST", path, body=body)
            return
        # The resourceVersion makes a concurrent writer's update fail instead of being lost.
        body["metadata"]["resourceVersion"] = existing["metadata"]["resourceVersion"]
        body["type"] = existing.get("type", body["type"])
        request(self._api, f"replace {what}", "PUT", self._secret_path(), body=body)

    def _secret_path(self) -> str:
        return f"/api/v1/namespaces/{self._namespace}/secrets/{self._secret}"

    def patch_ca_bundle(self, ca_bundle: bytes) -> None:
        """Set ``caBundle`` of every webhook in the configured configurations."""
        encoded = base64.b64encode(ca_bundle).decode()
        for name in self._configs:
            what = f"mutatingwebhookconfiguration {name}"
            path = f"/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/{name}"
            cfg = request(self._api, f"read {what}", "GET", path)
            if cfg is None:
                log.warning("webhook configuration not found name=%s", name)
                continue
            hooks = cfg.get("webhooks") or []
            if all(h.get("clientConfig", {}).get("caBundle") == encoded for h in hooks):
                continue
            for h in hooks:
                h.setdefault("clientConfig", {})["caBundle"] = encoded
            try:
                request(self._api, f"replace {what}", "PUT", path, body=cfg)
            except ApiCallError as e:
                if e.status != 409:
                    raise
                log.info("caBundle patch conflicted, retried on next sync config=%s", name)
                continue
            log.info("caBundle patched config=%s webhooks=%d", name, len(hooks))

    def _install(self, bundle: TlsBundle) -> None:
        with self._lock:
            if self._bundle == bundle and self._context is not None:
                return
        ctx = server_context(bundle)
        with self._lock:
            self._bundle, self._context = bundle, ctx
