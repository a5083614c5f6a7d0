"""Who vouches for a SecAgg+ message: each client signs what it advertises (its round keys, its share commitments,
the survivor set it agrees to) with the private key of its federation certificate, and sends the certificate.

A receiver takes a signature only from a certificate the federation CA issued directly, valid now, not revoked in
the CA's CRL, of role `worker` in this federation, of the signing client's cluster and of the name the job gives
that client's credential (`secure_aggregation.signers`, required in a job file). So a combiner that relays the messages
cannot substitute a neighbour's key, survivor set or commitments without a client's private key.

Statements are domain-separated and length-prefixed (`statement`), so a signature serves one purpose only.
"""
from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519

from security.signing import crl_number

__all__ = ["Signer", "Verifier", "statement", "MAX_CHAIN_BYTES", "MAX_SIGNATURE_BYTES", "load_signer",
           "load_verifier"]

MAX_CHAIN_BYTES = 4096  # one PEM leaf certificate of the federation (about 800 bytes) with room to spare
MAX_SIGNATURE_BYTES = 144  # DER ECDSA of P-521 at most; P-256 is about 72, Ed25519 64


def statement(purpose: bytes, *parts: bytes) -> bytes:
    """The bytes a client signs: `purpose` and each part, length-prefixed (no two statements share bytes)."""
    return b"".join(len(p).to_bytes(4, "big") + p for p in (purpose, *parts))


@dataclass(frozen=True, slots=True)
class Signer:
    """A client's certificate (PEM, sent with every signature) and its private key."""

    chain: bytes
    key: object = field(repr=False)

    def sign(self, data: bytes) -> bytes:
        if isinstance(self.key, ec.EllipticCurvePrivateKey):
            return self.key.sign(data, ec.ECDSA(hashes.SHA256()))
        if isinstance(self.key, ed25519.Ed25519PrivateKey):
            return self.key.sign(data)
        raise ValueError(f"a {type(self.key).__name__} cannot sign secure aggregation messages; use the EC key "
                         "its certificate was issued for")


def load_signer(cert: str | Path, key: str | Path) -> Signer:
    """The signer of certificate `cert` and key `key` (PEM files); ValueError naming the file and the fix."""
    try:
        chain = Path(cert).read_bytes()
        x509.load_pem_x509_certificate(chain)
        private = serialization.load_pem_private_key(Path(key).read_bytes(), password=None)
    except (OSError, ValueError, TypeError) as exc:
        raise ValueError(f"secure_aggregation signer {cert} / {key} cannot be read ({exc}); issue the client's "
                         "certificate with `nebula-admin cert issue --ca CA --role worker --cluster C --name N "
                         "--out DIR`") from None
    if len(chain) > MAX_CHAIN_BYTES:
        raise ValueError(f"secure_aggregation signer certificate {cert} is {len(chain)} bytes, over "
                         f"{MAX_CHAIN_BYTES}; give the client only its own leaf certificate")
    return Signer(chain, private)


class Verifier:
    """Checks a client's certificate and signature against the federation CA and CRL (`refusal` gives why not).

    `name_of(client)`: the certificate name required for a round client (None: any worker of its cluster)."""

    def __init__(self, ca_pem: bytes, crl_pem: bytes, federation: str,
                 name_of: Callable[[str], str | None] = lambda client: None,
                 now: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.timezone.utc),
                 crl_path: Path | None = None) -> None:
        self.ca = x509.load_pem_x509_certificate(ca_pem)
        self.crl = self._checked_crl(crl_pem)
        self.federation, self.name_of, self.now = federation, name_of, now
        # a verifier lives as long as its actor: the CRL file is read again when it changes, so a certificate
        # revoked during a job stops vouching from the next message on
        self._crl_path, self._crl_mtime = crl_path, self._mtime(crl_path)
        # (client, chain) -> its checked public key and serial; validity and revocation are checked on every use
        self._seen: dict[tuple[str, bytes], tuple[object, x509.Certificate]] = {}

    def _checked_crl(self, crl_pem: bytes) -> x509.CertificateRevocationList:
        crl = x509.load_pem_x509_crl(crl_pem)
        if not crl.is_signature_valid(self.ca.public_key()):
            raise ValueError("the CRL is not signed by the federation CA; write it with that CA's `nebula-admin crl`")
        return crl

    @staticmethod
    def _mtime(path: Path | None) -> int | None:
        try:
            return path.stat().st_mtime_ns if path is not None else None
        except OSError:
            return None

    def _refresh_crl(self) -> None:
        """Take the CRL file again if it changed and its replacement is the CA's and not older (by CRL Number)."""
        mtime = self._mtime(self._crl_path)
        if mtime is None or mtime == self._crl_mtime:
            return
        self._crl_mtime = mtime
        try:
            crl = self._checked_crl(self._crl_path.read_bytes())
        except (OSError, ValueError):
            return  # a CRL being rewritten or not the CA's: keep the one in force
        if crl_number(crl) >= crl_number(self.crl):
            self.crl = crl

    def _current(self, cert: x509.Certificate) -> None:
        """ValueError unless `cert` is valid now and not revoked by the CRL in force."""
        if not cert.not_valid_before_utc <= self.now() < cert.not_valid_after_utc:
            raise ValueError(f"its certificate (serial {cert.serial_number:x}) is expired or not yet valid")
        if self.crl.get_revoked_certificate_by_serial_number(cert.serial_number) is not None:
            raise ValueError(f"its certificate (serial {cert.serial_number:x}) is revoked")

    def _key(self, client: str, chain: bytes) -> object:
        """The public key of `chain` if it may speak for `client`; ValueError with the reason."""
        from security.errors import IdentityError
        from security.identity import identity_of

        self._refresh_crl()
        hit = self._seen.get((client, chain))
        if hit is not None:
            self._current(hit[1])
            return hit[0]
        if not isinstance(chain, bytes) or not 0 < len(chain) <= MAX_CHAIN_BYTES:
            raise ValueError(f"a certificate of 1..{MAX_CHAIN_BYTES} bytes must come with the signature")
        try:
            cert = x509.load_pem_x509_certificate(chain)
            cert.verify_directly_issued_by(self.ca)
        except (ValueError, TypeError, InvalidSignature):
            raise ValueError("its certificate is not one the federation CA issued") from None
        self._current(cert)
        try:
            ident = identity_of(cert)
        except IdentityError as exc:
            raise ValueError(f"its certificate names no identity ({exc})") from None
        cluster = client.split("/", 1)[0]
        want = self.name_of(client)
        if (ident.federation, ident.role, ident.cluster) != (self.federation, "worker", cluster) or (
                want is not None and ident.name != want):
            raise ValueError(f"its certificate is {ident.uri}, not spiffe://{self.federation}/worker/{cluster}/"
                             f"{want or '<name>'}")
        key = cert.public_key()
        self._seen[(client, chain)] = (key, cert)
        return key

    def refusal(self, client: str, chain: bytes, data: bytes, signature: bytes) -> str | None:
        """Why `signature` over `data` does not vouch for `client`, or None when it does."""
        try:
            key = self._key(client, chain)
        except ValueError as exc:
            return str(exc)
        if not isinstance(signature, bytes) or not 0 < len(signature) <= MAX_SIGNATURE_BYTES:
            return f"a signature is 1..{MAX_SIGNATURE_BYTES} bytes"
        try:
            if isinstance(key, ec.EllipticCurvePublicKey):
                key.verify(signature, data, ec.ECDSA(hashes.SHA256()))
            elif isinstance(key, ed25519.Ed25519PublicKey):
                key.verify(signature, data)
            else:
                return f"its certificate holds a {type(key).__name__}, which signs nothing here"
        except InvalidSignature:
            return "the signature does not verify under its certificate"
        return None


def load_verifier(ca: str | Path, crl: str | Path, federation: str,
                  name_of: Callable[[str], str | None] = lambda client: None) -> Verifier:
    """A Verifier of the CA certificate and CRL files; ValueError naming the file and the fix."""
    try:
        return Verifier(Path(ca).read_bytes(), Path(crl).read_bytes(), federation, name_of, crl_path=Path(crl))
    except (OSError, ValueError) as exc:
        raise ValueError(f"secure aggregation cannot check certificates against {ca} and {crl} ({exc}); point the "
                         "worker.yaml tls section at the federation's ca.pem and crl.pem") from None
