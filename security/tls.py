"""TLS contexts for switch servers (mutual TLS, 1.3 preferred, 1.2 minimum, CRL checked) and peer identity checks."""
from __future__ import annotations

import datetime as dt
import os
import ssl
from typing import Collection

from cryptography import x509
from cryptography.exceptions import InvalidSignature

from security._files import read_file
from security.errors import IdentityError, SecurityError, TLSConfigError
from security.identity import Identity, identity_of

__all__ = [
    "server_context",
    "client_context",
    "check_peer",
    "check_own_identity",
    "crl_serials",
    "describe_tls_error",
    "load_crl",
    "PeerRejected",
    "PEER_REASONS",
    "TLS_REASONS",
]

PEER_REASONS = ("no_certificate", "bad_certificate", "wrong_federation", "wrong_role", "wrong_cluster", "revoked")
TLS_REASONS = ("expired", "revoked", "unknown_ca", "bad_certificate", "no_certificate", "protocol_version",
               "plaintext", "handshake_failed")
# TLS 1.2 suites with forward secrecy and AEAD only; TLS 1.3 suites are all acceptable and stay at their defaults
_TLS12_CIPHERS = "ECDHE+AESGCM:ECDHE+CHACHA20"


class PeerRejected(SecurityError):
    """A TLS peer is authenticated but not the one expected; `reason_code` is one of PEER_REASONS."""

    def __init__(self, reason_code: str, message: str) -> None:
        super().__init__(message)
        self.reason_code = reason_code
        self.message = message


def _need(path: str | os.PathLike, what: str) -> bytes:
    return read_file(path, what, TLSConfigError, "provision it with `nebula-admin provision` or fix the path")


# what a site does about a bad or expired CRL (it holds no CA key: the admin's signed update brings a fresh one)
FIX_CRL = ("apply the admin's latest update (`nebula-switch reload --config switch.yaml --update FILE`; the admin "
           "writes one for every site with `nebula-admin provision renew --out DIR`, or `nebula-admin crl` on the "
           "CA's host)")


def load_crl(crl: str | os.PathLike, ca_cert: x509.Certificate | None = None) -> x509.CertificateRevocationList:
    """Parse a PEM CRL, check it is signed by `ca_cert` and not past its next update; raise TLSConfigError."""
    try:
        obj = x509.load_pem_x509_crl(_need(crl, "CRL"))
    except ValueError as exc:
        raise TLSConfigError(f"CRL {crl} is not a valid PEM CRL ({exc}); {FIX_CRL}") from None
    if ca_cert is not None and not obj.is_signature_valid(ca_cert.public_key()):
        raise TLSConfigError(f"CRL {crl} is not signed by the CA in use; write it with that CA's `nebula-admin crl`")
    nxt = obj.next_update_utc
    if nxt is not None and nxt < dt.datetime.now(dt.timezone.utc):
        raise TLSConfigError(f"CRL {crl} expired at {nxt:%Y-%m-%dT%H:%M:%SZ}; {FIX_CRL}")
    return obj


def crl_serials(crl_path: str | os.PathLike) -> frozenset[int]:
    """Serial numbers revoked in the CRL at `crl_path` (to re-check live sessions when the CRL is reloaded)."""
    return frozenset(r.serial_number for r in load_crl(crl_path))


def _context(purpose: int, ca: str, cert: str, key: str, crl: str, passphrase: str | bytes | None) -> ssl.SSLContext:
    try:
        ca_cert = x509.load_pem_x509_certificate(_need(ca, "CA certificate"))
    except ValueError as exc:
        raise TLSConfigError(f"CA certificate {ca} is not a valid PEM certificate ({exc})") from None
    load_crl(crl, ca_cert)
    _need(cert, "certificate")
    _need(key, "private key")
    ctx = ssl.SSLContext(purpose)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.set_ciphers(_TLS12_CIPHERS)
    ctx.verify_mode = ssl.CERT_REQUIRED
    if purpose == ssl.PROTOCOL_TLS_CLIENT:
        # peers are named by the identity in their certificate (check_peer), not by host name
        ctx.check_hostname = False
    try:
        ctx.load_cert_chain(str(cert), str(key), password=passphrase)
    except ssl.SSLError as exc:
        raise TLSConfigError(
            f"cannot use certificate {cert} with key {key} ({exc.reason or exc}): wrong passphrase, "
            "a key that does not match the certificate, or malformed PEM; check key_passphrase_env and the pair"
        ) from None
    except OSError as exc:
        raise TLSConfigError(f"cannot read {cert} / {key} ({exc}); check the paths") from None
    try:
        ctx.load_verify_locations(cafile=str(ca))
        ctx.load_verify_locations(cafile=str(crl))
    except ssl.SSLError as exc:
        raise TLSConfigError(f"cannot load CA {ca} or CRL {crl} into TLS ({exc.reason or exc})") from None
    ctx.verify_flags |= ssl.VERIFY_CRL_CHECK_LEAF | ssl.VERIFY_X509_STRICT
    return ctx


def server_context(ca: str | os.PathLike, cert: str | os.PathLike, key: str | os.PathLike, crl: str | os.PathLike,
                   passphrase: str | bytes | None = None) -> ssl.SSLContext:
    """Server-side context of a switch's WAN listener: client certificate required, CRL checked."""
    return _context(ssl.PROTOCOL_TLS_SERVER, str(ca), str(cert), str(key), str(crl), passphrase)


def client_context(ca: str | os.PathLike, cert: str | os.PathLike, key: str | os.PathLike, crl: str | os.PathLike,
                   passphrase: str | bytes | None = None) -> ssl.SSLContext:
    """Client-side context of a switch dialling a peer: presents its certificate, checks the peer's and the CRL."""
    return _context(ssl.PROTOCOL_TLS_CLIENT, str(ca), str(cert), str(key), str(crl), passphrase)


def check_peer(ssl_obj: ssl.SSLObject | ssl.SSLSocket, *, role: str | None, cluster: str | None,
               federation: str | None, revoked: Collection[int] = ()) -> Identity:
    """Identity of the authenticated peer if it has `role`, `cluster` and `federation` (None = any); else PeerRejected.

    `revoked` holds serials revoked since the context was built (from `crl_serials`), for live re-checks.
    """
    der = ssl_obj.getpeercert(binary_form=True)
    if not der:
        raise PeerRejected("no_certificate", "peer presented no certificate; configure its TLS cert and key")
    try:
        cert = x509.load_der_x509_certificate(der)
        ident = identity_of(cert)
    except (ValueError, IdentityError) as exc:
        raise PeerRejected("bad_certificate", f"peer certificate carries no valid identity: {exc}") from None
    if cert.serial_number in revoked:
        raise PeerRejected("revoked", f"peer {ident.uri} certificate serial {cert.serial_number:x} is revoked")
    if federation is not None and ident.federation != federation:
        raise PeerRejected("wrong_federation",
                           f"peer {ident.uri} belongs to federation {ident.federation!r}, expected {federation!r}")
    if role is not None and ident.role != role:
        raise PeerRejected("wrong_role", f"peer {ident.uri} has role {ident.role!r}, expected {role!r}")
    if cluster is not None and ident.cluster != cluster:
        raise PeerRejected("wrong_cluster", f"peer {ident.uri} is of cluster {ident.cluster!r}, expected {cluster!r}")
    return ident


def check_own_identity(ca: str | os.PathLike, cert: str | os.PathLike, crl: str | os.PathLike, *, role: str,
                       cluster: str | None, federation: str, now: dt.datetime | None = None) -> Identity:
    """Identity of this process's own certificate if it may serve: issued by `ca`, valid now, not revoked in `crl`,
    of `role`, `cluster` and `federation`; else TLSConfigError naming the file, the problem and the fix."""
    try:
        ca_cert = x509.load_pem_x509_certificate(_need(ca, "CA certificate"))
    except ValueError as exc:
        raise TLSConfigError(f"CA certificate {ca} is not a valid PEM certificate ({exc})") from None
    try:
        own = x509.load_pem_x509_certificate(_need(cert, "certificate"))
    except ValueError as exc:
        raise TLSConfigError(f"certificate {cert} is not a valid PEM certificate ({exc}); issue it again with "
                             "`nebula-admin cert issue`") from None
    serial = f"{own.serial_number:x}"
    try:
        own.verify_directly_issued_by(ca_cert)
    except (ValueError, TypeError, InvalidSignature):
        raise TLSConfigError(
            f"certificate {cert} (serial {serial}, issuer {own.issuer.rfc4514_string()}) is not issued by the CA "
            f"{ca} ({ca_cert.subject.rfc4514_string()}): peers would refuse it; issue it with that CA "
            "(`nebula-admin cert issue --ca DIR ...`) or point tls.ca at the CA that issued it") from None
    now = now or dt.datetime.now(dt.timezone.utc)
    if now < own.not_valid_before_utc:
        raise TLSConfigError(f"certificate {cert} (serial {serial}) is not valid before "
                             f"{own.not_valid_before_utc:%Y-%m-%dT%H:%M:%SZ}; check this host's clock or wait")
    if now >= own.not_valid_after_utc:
        raise TLSConfigError(f"certificate {cert} (serial {serial}) expired at "
                             f"{own.not_valid_after_utc:%Y-%m-%dT%H:%M:%SZ}; renew it with "
                             f"`nebula-admin cert renew --ca DIR --serial {serial}`")
    if load_crl(crl, ca_cert).get_revoked_certificate_by_serial_number(own.serial_number) is not None:
        raise TLSConfigError(f"certificate {cert} (serial {serial}) is revoked in the CRL {crl}; issue a new one "
                             "with `nebula-admin cert issue` (a revoked certificate cannot be renewed)")
    try:
        ident = identity_of(own)
    except IdentityError as exc:
        raise TLSConfigError(f"certificate {cert}: {exc}") from None
    for what, have, want in (("federation", ident.federation, federation), ("role", ident.role, role),
                             ("cluster", ident.cluster, cluster)):
        if have != want:
            wanted = _ident_wanted(federation, role, cluster)
            raise TLSConfigError(f"certificate {cert} is {ident.uri}, of {what} {have!r}, but this process serves "
                                 f"{what} {want!r}; use a certificate issued for {wanted} "
                                 f"(`nebula-admin cert issue --role {role}"
                                 f"{f' --cluster {cluster}' if cluster else ''} ...`) or fix the config")
    return ident


def _ident_wanted(federation: str, role: str, cluster: str | None) -> str:
    """The identity URI a certificate for `role` in `cluster` of `federation` carries (for messages)."""
    return f"spiffe://{federation}/{role}/{cluster or '-'}/<name>"


_VERIFY_CODES = {
    9: "expired",  # not yet valid: outside its validity window all the same
    10: "expired",
    11: "expired",  # the CRL is not yet valid
    12: "expired",  # the CRL is past its next update
    23: "revoked",
    2: "unknown_ca",
    18: "unknown_ca",
    19: "unknown_ca",
    20: "unknown_ca",
    21: "unknown_ca",
    7: "bad_certificate",
    26: "bad_certificate",  # unsuitable purpose: e.g. a client-only certificate used by a server
}
_ALERTS = (
    ("CERTIFICATE_EXPIRED", "expired"),
    ("CERTIFICATE_REVOKED", "revoked"),
    ("UNKNOWN_CA", "unknown_ca"),
    ("CERTIFICATE_REQUIRED", "no_certificate"),
    ("PEER_DID_NOT_RETURN_A_CERTIFICATE", "no_certificate"),
    ("BAD_CERTIFICATE", "bad_certificate"),
    ("UNSUPPORTED_CERTIFICATE", "bad_certificate"),
    ("CERTIFICATE_UNKNOWN", "bad_certificate"),
    ("PROTOCOL_VERSION", "protocol_version"),
    ("UNSUPPORTED_PROTOCOL", "protocol_version"),
    ("NO_PROTOCOLS_AVAILABLE", "protocol_version"),
    ("WRONG_VERSION_NUMBER", "plaintext"),
    ("HTTP_REQUEST", "plaintext"),
    ("PACKET_LENGTH_TOO_LONG", "plaintext"),
    ("RECORD_LAYER_FAILURE", "plaintext"),
)


def describe_tls_error(exc: BaseException) -> str:
    """Map a handshake failure to one of TLS_REASONS (for audit records and peer rejection logs)."""
    code = getattr(exc, "verify_code", None)
    if code in _VERIFY_CODES:
        return _VERIFY_CODES[code]
    text = f"{getattr(exc, 'reason', '') or ''} {exc}".upper()
    for needle, reason in _ALERTS:
        if needle in text:
            return reason
    if isinstance(exc, ssl.SSLCertVerificationError):
        return "bad_certificate"
    return "handshake_failed"
