"""What a Nebula CA signs, built without I/O: the root, leaf certificates by role, CRLs, CSRs, and key encodings.

`security.ca` keeps the CA's files, index and audit trail and calls these to make what it stores.
"""
from __future__ import annotations

import datetime as dt
import ipaddress
from typing import Iterable

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from security.errors import CAError
from security.identity import Identity

__all__ = ["CA_DAYS", "CRL_DAYS", "DEFAULT_DAYS", "REVOCATION_REASONS", "Revoked", "csr_for", "format_serial",
           "leaf_certificate", "now", "parse_serial", "private_key_pem", "read_csr", "revocation_list",
           "root_certificate"]

DEFAULT_DAYS = {"switch": 30, "worker": 30, "user": 30, "admin": 1}
CA_DAYS = 3650
CRL_DAYS = 7
SKEW = dt.timedelta(minutes=5)  # certificates and CRLs start this early: small clock skew between clusters
REVOCATION_REASONS = {
    "unspecified": x509.ReasonFlags.unspecified,
    "key_compromise": x509.ReasonFlags.key_compromise,
    "ca_compromise": x509.ReasonFlags.ca_compromise,
    "affiliation_changed": x509.ReasonFlags.affiliation_changed,
    "superseded": x509.ReasonFlags.superseded,
    "cessation_of_operation": x509.ReasonFlags.cessation_of_operation,
    "certificate_hold": x509.ReasonFlags.certificate_hold,
    "privilege_withdrawn": x509.ReasonFlags.privilege_withdrawn,
}
_EKU = {
    "switch": [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH],
    "worker": [ExtendedKeyUsageOID.CLIENT_AUTH],
    "admin": [ExtendedKeyUsageOID.CLIENT_AUTH],
    "user": [ExtendedKeyUsageOID.CLIENT_AUTH],
}
Revoked = tuple[int, dt.datetime, str]  # (serial, when, reason): one entry of a CRL


def format_serial(serial: int) -> str:
    """Serial as lowercase hex, the form `cert list` prints and `--serial` accepts."""
    return f"{serial:x}"


def parse_serial(text: str | int) -> int:
    """Parse a serial given as hex (optionally `0x`-prefixed or colon-separated) or an int."""
    if isinstance(text, int):
        return text
    cleaned = text.strip().lower().removeprefix("0x").replace(":", "")
    try:
        return int(cleaned, 16)
    except ValueError:
        raise CAError(f"serial {text!r} is not a hex number; copy it from `nebula-admin cert list`") from None


def now() -> dt.datetime:
    """The current UTC time, to the second (what certificates and the index record)."""
    return dt.datetime.now(dt.timezone.utc).replace(microsecond=0)


def _key_usage(**flags: bool) -> x509.KeyUsage:
    """KeyUsage with the given flags set and every other flag cleared."""
    names = ("digital_signature", "content_commitment", "key_encipherment", "data_encipherment", "key_agreement",
             "key_cert_sign", "crl_sign", "encipher_only", "decipher_only")
    return x509.KeyUsage(**{n: flags.get(n, False) for n in names})


def private_key_pem(key, passphrase: str | bytes | None) -> bytes:
    """PKCS#8 PEM of `key`, encrypted with `passphrase` when one is given."""
    pw = passphrase.encode() if isinstance(passphrase, str) else passphrase
    enc = serialization.BestAvailableEncryption(pw) if pw else serialization.NoEncryption()
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, enc)


def root_certificate(key: ec.EllipticCurvePrivateKey, federation: str, days: int = CA_DAYS) -> x509.Certificate:
    """A federation's self-signed root: it may sign leaves and CRLs, and no other CA."""
    name = x509.Name([
        x509.NameAttribute(NameOID.ORGANIZATION_NAME, federation),
        x509.NameAttribute(NameOID.COMMON_NAME, f"{federation} Nebula CA"),
    ])
    t = now()
    return (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(t - SKEW)
        .not_valid_after(t + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(key_cert_sign=True, crl_sign=True), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )


def _check_leaf_key(public_key) -> None:
    if not isinstance(public_key, (ec.EllipticCurvePublicKey, rsa.RSAPublicKey, ed25519.Ed25519PublicKey)):
        raise CAError(f"key type {type(public_key).__name__} is not supported; use ECDSA P-256")
    if isinstance(public_key, rsa.RSAPublicKey) and public_key.key_size < 2048:
        raise CAError(f"RSA key of {public_key.key_size} bits is too small; use ECDSA P-256 (or RSA >= 2048)")


def _sans(ident: Identity, dns: Iterable[str], ips: Iterable[str]) -> list[x509.GeneralName]:
    sans: list[x509.GeneralName] = [x509.UniformResourceIdentifier(ident.uri)]
    sans.extend(x509.DNSName(d) for d in dns)
    for ip in ips:
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(ip)))
        except ValueError:
            raise CAError(f"IP SAN {ip!r} is not an IP address; pass e.g. --ip 127.0.0.1") from None
    return sans


def leaf_certificate(ca_cert: x509.Certificate, ca_key, public_key, ident: Identity, days: int | None,
                     dns: Iterable[str] = (), ips: Iterable[str] = ()) -> x509.Certificate:
    """The certificate of `ident` for `public_key`: its role's key usages, its URI (and the DNS and IP names) as
    subject alternative names, valid for `days` (None: the role's default) but never beyond the root."""
    if days is None:
        days = DEFAULT_DAYS[ident.role]
    if not isinstance(days, (int, float)) or days <= 0:
        raise CAError(f"days={days!r} must be a positive number of days")
    _check_leaf_key(public_key)
    sans = _sans(ident, dns, ips)
    t = now()
    not_after = min(t + dt.timedelta(days=days), ca_cert.not_valid_after_utc)
    subject = x509.Name([
        x509.NameAttribute(NameOID.ORGANIZATION_NAME, ident.federation),
        x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, ident.role),
        x509.NameAttribute(NameOID.COMMON_NAME, ident.name),
    ])
    ec_key = not isinstance(public_key, rsa.RSAPublicKey)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(ca_cert.subject)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(t - SKEW)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(digital_signature=True, key_encipherment=not ec_key), critical=True)
        .add_extension(x509.ExtendedKeyUsage(_EKU[ident.role]), critical=False)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public_key), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_cert.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )


def revocation_list(ca_cert: x509.Certificate, ca_key, revoked: Iterable[Revoked], number: int,
                    days: int = CRL_DAYS) -> x509.CertificateRevocationList:
    """CRL number `number` of the root, listing `revoked`, next update in `days`."""
    t = now()
    builder = (
        x509.CertificateRevocationListBuilder()
        .issuer_name(ca_cert.subject)
        .last_update(t - SKEW)
        .next_update(t + dt.timedelta(days=days))
        .add_extension(x509.CRLNumber(number), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_cert.public_key()), critical=False)
    )
    for serial, when, reason in revoked:
        entry = x509.RevokedCertificateBuilder().serial_number(serial).revocation_date(when)
        if reason and reason != "unspecified":
            entry = entry.add_extension(x509.CRLReason(REVOCATION_REASONS[reason]), critical=False)
        builder = builder.add_revoked_certificate(entry.build())
    return builder.sign(ca_key, hashes.SHA256())


def csr_for(name: str, key: ec.EllipticCurvePrivateKey, uri: str | None = None) -> x509.CertificateSigningRequest:
    """A request naming `name` as its common name (and identity `uri` as its URI SAN, when given: what a renewal
    asks for), signed by `key` (the requesting host's own)."""
    builder = x509.CertificateSigningRequestBuilder().subject_name(
        x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
    if uri is not None:
        builder = builder.add_extension(x509.SubjectAlternativeName([x509.UniformResourceIdentifier(uri)]),
                                        critical=False)
    return builder.sign(key, hashes.SHA256())


def read_csr(data: bytes, where: object) -> tuple[x509.CertificateSigningRequest, str | None]:
    """(the request in PEM `data`, its common name or None); CAError naming `where` if it is malformed or its
    signature does not hold."""
    try:
        csr = x509.load_pem_x509_csr(data)
    except ValueError as exc:
        raise CAError(f"CSR {where} is not a valid PEM certificate request ({exc})") from None
    if not csr.is_signature_valid:
        raise CAError(f"CSR {where} has a bad signature; recreate it with the matching private key")
    cns = csr.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    return csr, (cns[0].value if cns else None)
