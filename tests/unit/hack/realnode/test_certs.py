"""The node client certificate comes from the cluster CA with the node identity."""

from __future__ import annotations

from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from hack.devcluster.pki import ensure_pki
from hack.devcluster.realnode.certs import node_client_cert


def test_node_cert_has_node_identity_and_is_signed_by_the_cluster_ca(tmp_path: Path) -> None:
    pki = ensure_pki(tmp_path / "pki")
    cert_pem, key_pem = node_client_cert(pki, "rn1")
    cert = x509.load_pem_x509_certificate(cert_pem)
    cn = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value
    org = cert.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)[0].value
    assert (cn, org) == ("system:node:rn1", "system:nodes")
    eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert ExtendedKeyUsageOID.CLIENT_AUTH in eku
    ca = x509.load_pem_x509_certificate(pki.ca_cert.read_bytes())
    assert cert.issuer == ca.subject
    cert.verify_directly_issued_by(ca)
    assert b"PRIVATE KEY" in key_pem
    pub = ca.public_key()
    assert isinstance(pub, ec.EllipticCurvePublicKey)
