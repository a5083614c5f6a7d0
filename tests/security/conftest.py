"""Fixtures for security tests: a throwaway federation CA and helpers that forge certificates the CA would refuse."""
from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from security.ca import CertificateAuthority


@pytest.fixture
def ca(tmp_path: Path) -> CertificateAuthority:
    """A fresh CA for federation `demo`."""
    return CertificateAuthority.init(tmp_path / "ca", "demo")


def forge_leaf(ca: CertificateAuthority, out: Path, uri: str, *, not_before: dt.datetime, not_after: dt.datetime,
               eku=(ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH)) -> tuple[Path, Path]:
    """Sign a leaf with the CA key directly (e.g. one already expired), bypassing the CA's own checks."""
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "forged")]))
        .issuer_name(ca.cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage(list(eku)), critical=False)
        .add_extension(x509.SubjectAlternativeName([x509.UniformResourceIdentifier(uri),
                                                    x509.DNSName("localhost")]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca.cert.public_key()), critical=False)
        .sign(ca.key, hashes.SHA256())
    )
    out.mkdir(parents=True, exist_ok=True)
    cert_path, key_path = out / "forged.pem", out / "forged.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path
