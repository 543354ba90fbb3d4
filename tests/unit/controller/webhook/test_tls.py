"""The webhook's serving context is made without writing a file: the controller runs with a
read-only root file system and no writable volume."""

from __future__ import annotations

import datetime as dt
import os
import socket
import ssl
import tempfile
import threading
from pathlib import Path

import pytest
from kubernetes import client

from controller.webhook.certs import CertPolicy, rotate
from controller.webhook.tls import WebhookTls

POLICY = CertPolicy(
    dns_names=("tranche-controller.tranche.svc",),
    ca_validity=dt.timedelta(days=300),
    cert_validity=dt.timedelta(days=30),
)


def _read_only_tmpdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """TMPDIR as on a read-only root: a directory no file can be created in (a path under a
    regular file fails for root too, unlike permission bits)."""
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    tmp = blocker / "tmp"
    monkeypatch.setenv("TMPDIR", str(tmp))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    with pytest.raises(OSError):
        tempfile.mkdtemp()
    return tmp


def test_the_serving_context_needs_no_writable_temp_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bundle = rotate(None, POLICY, dt.datetime.now(dt.UTC))
    _read_only_tmpdir(tmp_path, monkeypatch)
    fds_before = set(os.listdir("/proc/self/fd"))
    with client.ApiClient() as api:  # never called: _install only builds the context
        tls = WebhookTls(api, "tranche", "tranche-webhook-tls", webhook_configs=(), policy=POLICY)
        tls._install(bundle)
    server_ctx = tls.context()
    assert server_ctx is not None
    assert set(os.listdir("/proc/self/fd")) <= fds_before  # the in-memory files are closed

    client_ctx = ssl.create_default_context(cadata=bundle.ca_bundle.decode())
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def serve() -> None:
        conn, _ = listener.accept()
        with server_ctx.wrap_socket(conn, server_side=True) as s:
            s.sendall(b"ok")

    t = threading.Thread(target=serve)
    t.start()
    with (
        socket.create_connection(("127.0.0.1", port)) as raw,
        client_ctx.wrap_socket(raw, server_hostname="tranche-controller.tranche.svc") as s,
    ):
        assert s.recv(2) == b"ok"
    t.join()
    listener.close()
