"""TLS for the controller's webhooks: a self-signed CA and a serving certificate.

Both live in one Secret (``ca.crt``, ``ca.key``, ``tls.crt``, ``tls.key``); the
CA bundle is patched into the webhook configurations as ``caBundle``. Only the
leader writes: it creates the pair when the Secret is missing, renews the
serving certificate when less than a third of its lifetime is left (or its
names changed) and renews the CA the same way. ``ca.crt`` keeps the previous
CA next to the new one until it expires, so clients holding the old bundle
keep trusting the serving certificate during the switch.
"""

from __future__ import annotations

import base64
import datetime as dt
import ipaddress
import logging
from collections.abc import Sequence
from dataclasses import dataclass

from cryptography import x509
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

log = logging.getLogger(__name__)

RENEW_FRACTION = 1 / 3  # renew when less than this share of the lifetime is left
_BACKDATE = dt.timedelta(minutes=5)  # tolerate clock skew between nodes


@dataclass(frozen=True)
class TlsBundle:
    """The PEM contents of the webhook TLS Secret."""

    ca_bundle: bytes  # the current CA first, then a previous one still valid
    ca_key: bytes
    cert: bytes
    key: bytes

    def ca_cert(self) -> x509.Certificate:
        return x509.load_pem_x509_certificates(self.ca_bundle)[0]

    def serving_cert(self) -> x509.Certificate:
        return x509.load_pem_x509_certificate(self.cert)

    def secret_data(self) -> dict[str, str]:
        raw = {"ca.crt": self.ca_bundle, "ca.key": self.ca_key}
        raw |= {"tls.crt": self.cert, "tls.key": self.key}
        return {k: base64.b64encode(v).decode() for k, v in raw.items()}

    @classmethod
    def from_secret_data(cls, data: dict[str, str]) -> TlsBundle | None:
        """The bundle in a Secret's ``data``; None if an entry is missing, not PEM, or a
        private key does not belong to its certificate."""
        try:
            raw = {k: base64.b64decode(data[k]) for k in ("ca.crt", "ca.key", "tls.crt", "tls.key")}
            bundle = cls(raw["ca.crt"], raw["ca.key"], raw["tls.crt"], raw["tls.key"])
            _check_key("ca.key", bundle.ca_key, bundle.ca_cert())
            _check_key("tls.key", bundle.key, bundle.serving_cert())
        except (KeyError, ValueError, TypeError, UnsupportedAlgorithm) as e:
            log.warning("webhook TLS secret unusable error=%s", e)
            return None
        return bundle


def _public(key: object) -> bytes:
    if not isinstance(key, ec.EllipticCurvePublicKey | ec.EllipticCurvePrivateKey):
        raise ValueError(f"not an elliptic-curve key: {type(key).__name__}")
    public = key.public_key() if isinstance(key, ec.EllipticCurvePrivateKey) else key
    return public.public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def _check_key(name: str, key_pem: bytes, cert: x509.Certificate) -> None:
    """ValueError unless ``key_pem`` is the private key of ``cert``."""
    key = serialization.load_pem_private_key(key_pem, password=None)
    if _public(key) != _public(cert.public_key()):
        raise ValueError(f"{name} does not belong to its certificate")


@dataclass(frozen=True)
class CertPolicy:
    """Names and lifetimes of the certificates."""

    dns_names: tuple[str, ...]
    ip_addresses: tuple[str, ...] = ()
    ca_validity: dt.timedelta = dt.timedelta(days=5 * 365)
    cert_validity: dt.timedelta = dt.timedelta(days=90)


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def new_ca(validity: dt.timedelta, now: dt.datetime) -> tuple[bytes, bytes]:
    """A self-signed CA: (certificate PEM, key PEM)."""
    key = _key()
    name = x509.Name(
        [x509.NameAttribute(NameOID.COMMON_NAME, f"tranche-webhook-ca-{now:%Y%m%d%H%M%S}")]
    )
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _BACKDATE)
        .not_valid_after(now + validity)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True, key_cert_sign=True, crl_sign=True,
                content_commitment=False, key_encipherment=False, data_encipherment=False,
                key_agreement=False, encipher_only=False, decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )  # fmt: skip
    return _pem(cert), _pem_key(key)


def issue_serving(
    ca_cert_pem: bytes, ca_key_pem: bytes, policy: CertPolicy, now: dt.datetime
) -> tuple[bytes, bytes]:
    """A serving certificate for ``policy``'s names, signed by the CA: (cert PEM, key PEM)."""
    ca_cert = x509.load_pem_x509_certificate(ca_cert_pem)
    ca_key = serialization.load_pem_private_key(ca_key_pem, password=None)
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise ValueError("ca.key: not an EC private key")
    key = _key()
    sans: list[x509.GeneralName] = [x509.DNSName(n) for n in policy.dns_names]
    sans += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in policy.ip_addresses]
    cn = policy.dns_names[0] if policy.dns_names else "tranche-webhook"
    not_after = min(now + policy.cert_validity, ca_cert.not_valid_after_utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _BACKDATE)
        .not_valid_after(not_after)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_cert.public_key()),  # type: ignore[arg-type]
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    return _pem(cert), _pem_key(key)


def _worn(cert: x509.Certificate, now: dt.datetime) -> bool:
    life = cert.not_valid_after_utc - cert.not_valid_before_utc
    return cert.not_valid_after_utc - now < life * RENEW_FRACTION


def _names(cert: x509.Certificate) -> tuple[set[str], set[str]]:
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return set(), set()
    dns = set(san.get_values_for_type(x509.DNSName))
    ips = {str(ip) for ip in san.get_values_for_type(x509.IPAddress)}
    return dns, ips


def rotation_reason(bundle: TlsBundle | None, policy: CertPolicy, now: dt.datetime) -> str:
    """Why the bundle must be renewed now; empty when it is fine."""
    if bundle is None:
        return "missing"
    ca, cert = bundle.ca_cert(), bundle.serving_cert()
    if _worn(ca, now):
        return f"CA expires {ca.not_valid_after_utc:%Y-%m-%dT%H:%M:%SZ}"
    if _worn(cert, now):
        return f"serving certificate expires {cert.not_valid_after_utc:%Y-%m-%dT%H:%M:%SZ}"
    if cert.issuer != ca.subject:
        return "serving certificate not issued by the current CA"
    dns, ips = _names(cert)
    want_ips = {str(ipaddress.ip_address(ip)) for ip in policy.ip_addresses}
    if dns != set(policy.dns_names) or ips != want_ips:
        return "serving certificate names differ from the configured ones"
    return ""


def rotate(bundle: TlsBundle | None, policy: CertPolicy, now: dt.datetime) -> TlsBundle:
    """A renewed bundle: a new CA when the old one is missing or worn, always a new cert."""
    if bundle is None or _worn(bundle.ca_cert(), now):
        ca_pem, ca_key = new_ca(policy.ca_validity, now)
        previous = [] if bundle is None else _still_valid(bundle.ca_bundle, now)[:1]
        ca_bundle = b"".join([ca_pem, *previous])
    else:
        ca_pem, ca_key = _pem(bundle.ca_cert()), bundle.ca_key
        ca_bundle = b"".join([ca_pem, *_still_valid(bundle.ca_bundle, now)[1:2]])
    cert, key = issue_serving(ca_pem, ca_key, policy, now)
    return TlsBundle(ca_bundle=ca_bundle, ca_key=ca_key, cert=cert, key=key)


def _still_valid(pem_bundle: bytes, now: dt.datetime) -> Sequence[bytes]:
    certs = x509.load_pem_x509_certificates(pem_bundle)
    return [_pem(c) for c in certs if c.not_valid_after_utc > now]
