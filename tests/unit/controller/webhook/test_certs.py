"""Webhook TLS: a CA and serving certificate, renewed before expiry, old CA kept for the switch."""

from __future__ import annotations

import datetime as dt
import socket
import ssl
import tempfile
import threading
from pathlib import Path

from cryptography import x509

from controller.webhook.certs import CertPolicy, TlsBundle, rotate, rotation_reason

NOW = dt.datetime(2026, 3, 1, tzinfo=dt.UTC)
POLICY = CertPolicy(
    dns_names=("tranche-controller.tranche.svc",),
    ip_addresses=("127.0.0.1",),
    ca_validity=dt.timedelta(days=300),
    cert_validity=dt.timedelta(days=30),
)


def test_a_missing_secret_gets_a_ca_and_a_cert_for_the_configured_names() -> None:
    assert rotation_reason(None, POLICY, NOW) == "missing"
    b = rotate(None, POLICY, NOW)
    assert rotation_reason(b, POLICY, NOW) == ""
    cert = b.serving_cert()
    assert cert.issuer == b.ca_cert().subject
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["tranche-controller.tranche.svc"]
    again = TlsBundle.from_secret_data(b.secret_data())
    assert again == b


def test_the_serving_cert_is_renewed_when_a_third_of_its_life_is_left() -> None:
    b = rotate(None, POLICY, NOW)
    assert rotation_reason(b, POLICY, NOW + dt.timedelta(days=15)) == ""
    later = NOW + dt.timedelta(days=21)
    assert "serving certificate expires" in rotation_reason(b, POLICY, later)
    renewed = rotate(b, POLICY, later)
    assert renewed.ca_key == b.ca_key  # same CA: no caBundle change needed
    assert renewed.serving_cert().not_valid_after_utc > b.serving_cert().not_valid_after_utc
    assert rotation_reason(renewed, POLICY, later) == ""


def test_a_worn_ca_is_replaced_and_the_old_one_stays_in_the_bundle() -> None:
    b = rotate(None, POLICY, NOW)
    later = NOW + dt.timedelta(days=250)
    assert rotation_reason(b, POLICY, later).startswith("CA expires")
    renewed = rotate(b, POLICY, later)
    cas = x509.load_pem_x509_certificates(renewed.ca_bundle)
    assert [c.subject for c in cas] == [renewed.ca_cert().subject, b.ca_cert().subject]
    assert renewed.serving_cert().issuer == cas[0].subject


def test_changed_names_force_a_new_certificate() -> None:
    b = rotate(None, POLICY, NOW)
    other = CertPolicy(dns_names=("other.svc",), ca_validity=POLICY.ca_validity)
    assert "names differ" in rotation_reason(b, other, NOW)


def test_a_corrupt_secret_is_treated_as_missing() -> None:
    b = rotate(None, POLICY, NOW)
    data = b.secret_data() | {"tls.crt": "bm90IGEgY2VydA=="}
    assert TlsBundle.from_secret_data(data) is None
    assert TlsBundle.from_secret_data({}) is None


def test_a_secret_whose_keys_do_not_load_or_match_is_treated_as_missing() -> None:
    """A key that is not PEM, or that belongs to another certificate, would stop the
    webhook's TLS set-up (or the next renewal): the leader replaces such a Secret."""
    b = rotate(None, POLICY, NOW)
    other = rotate(None, POLICY, NOW)
    not_pem = "bm90IGEga2V5"
    assert TlsBundle.from_secret_data(b.secret_data() | {"tls.key": not_pem}) is None
    assert TlsBundle.from_secret_data(b.secret_data() | {"ca.key": not_pem}) is None
    mismatched = b.secret_data() | {"tls.key": other.secret_data()["tls.key"]}
    assert TlsBundle.from_secret_data(mismatched) is None
    foreign_ca_key = b.secret_data() | {"ca.key": other.secret_data()["ca.key"]}
    assert TlsBundle.from_secret_data(foreign_ca_key) is None
    assert rotation_reason(TlsBundle.from_secret_data(mismatched), POLICY, NOW) == "missing"


def test_a_client_trusting_the_bundle_completes_a_handshake_with_the_cert() -> None:
    b = rotate(None, POLICY, dt.datetime.now(dt.UTC))
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "c.pem").write_bytes(b.cert)
        (Path(tmp) / "k.pem").write_bytes(b.key)
        server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        server_ctx.load_cert_chain(Path(tmp) / "c.pem", Path(tmp) / "k.pem")
    client_ctx = ssl.create_default_context(cadata=b.ca_bundle.decode())
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def serve() -> None:
        conn, _ = listener.accept()
        with server_ctx.wrap_socket(conn, server_side=True) as s:
            s.sendall(b"hi")

    t = threading.Thread(target=serve)
    t.start()
    with (
        socket.create_connection(("127.0.0.1", port)) as raw,
        client_ctx.wrap_socket(raw, server_hostname="tranche-controller.tranche.svc") as s,
    ):
        assert s.recv(2) == b"hi"
    t.join()
    listener.close()
