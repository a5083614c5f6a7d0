"""CURVE key pairs for ZeroMQ (X25519, Z85-encoded) written in ZeroMQ's certificate file format, without ZeroMQ."""
from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import os
import re

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import x25519

from security._files import PUBLIC, atomic_write, read_file
from security.errors import SecurityError

__all__ = ["z85_encode", "z85_decode", "write_curve_keypair", "read_curve_keypair", "curve_public_from_secret",
           "local_password"]

_Z85 = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#"
_Z85_INDEX = {c: i for i, c in enumerate(_Z85)}
_LINE = re.compile(r'^\s*(public|secret)-key\s*=\s*"?([^"\s]+)"?\s*$')


def z85_encode(data: bytes) -> str:
    """Z85 (ZeroMQ RFC 32) encoding of `data`, whose length must be a multiple of 4."""
    if len(data) % 4:
        raise ValueError(f"Z85 input length {len(data)} is not a multiple of 4")
    out = []
    for i in range(0, len(data), 4):
        value = int.from_bytes(data[i:i + 4], "big")
        chunk = []
        for _ in range(5):
            value, rem = divmod(value, 85)
            chunk.append(_Z85[rem])
        out.extend(reversed(chunk))
    return "".join(out)


def z85_decode(text: str) -> bytes:
    """Inverse of `z85_encode`; raises ValueError for bad length or characters."""
    if len(text) % 5:
        raise ValueError(f"Z85 text length {len(text)} is not a multiple of 5")
    out = bytearray()
    for i in range(0, len(text), 5):
        value = 0
        for c in text[i:i + 5]:
            if c not in _Z85_INDEX:
                raise ValueError(f"{c!r} is not a Z85 character")
            value = value * 85 + _Z85_INDEX[c]
        if value >= 2**32:
            raise ValueError(f"Z85 group {text[i:i + 5]!r} is out of range")
        out += value.to_bytes(4, "big")
    return bytes(out)


def curve_public_from_secret(secret_z85: str) -> str:
    """The Z85 public key belonging to a Z85 CURVE secret key."""
    key = x25519.X25519PrivateKey.from_private_bytes(z85_decode(secret_z85))
    return z85_encode(key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw))


def local_password(secret_z85: str, peer_public_z85: str) -> str:
    """The password a worker gives (ZeroMQ PLAIN) on its switch's same-host IPC endpoint.

    Both ends compute it from their own CURVE secret and the other's public key (X25519), so it needs no new
    secret, is bound to that one worker-switch pair, and the switch stores nothing beyond the worker's public key.
    """
    own = x25519.X25519PrivateKey.from_private_bytes(z85_decode(secret_z85))
    shared = own.exchange(x25519.X25519PublicKey.from_public_bytes(z85_decode(peer_public_z85)))
    pair = "".join(sorted((curve_public_from_secret(secret_z85), peer_public_z85)))
    return hmac.new(shared, b"nebula local ipc password v1|" + pair.encode(), hashlib.sha256).hexdigest()


def _cert_text(kind: str, public: str, secret: str | None) -> str:
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    head = [f"#   ****  Generated on {stamp} by nebula-admin  ****", f"#   ZeroMQ CURVE {kind} Certificate"]
    if secret is not None:
        head.append("#   DO NOT PROVIDE THIS FILE TO OTHER USERS nor change its permissions.")
    body = ["", "metadata", "curve", f'    public-key = "{public}"']
    if secret is not None:
        body.append(f'    secret-key = "{secret}"')
    return "\n".join(head + body) + "\n"


def write_curve_keypair(path: str | os.PathLike, public_path: str | os.PathLike | None = None) -> str:
    """Generate an X25519 key pair, write it as a ZeroMQ secret certificate at `path` (0600); return the public Z85.

    With `public_path`, also write the public-only certificate there (0644) for the peer that pins this key.
    """
    key = x25519.X25519PrivateKey.generate()
    secret = z85_encode(key.private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw,
                                          serialization.NoEncryption()))
    public = z85_encode(key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw))
    atomic_write(path, _cert_text("**Secret**", public, secret).encode())
    if public_path is not None:
        atomic_write(public_path, _cert_text("Public", public, None).encode(), PUBLIC)
    return public


def read_curve_keypair(path: str | os.PathLike) -> tuple[str, str | None]:
    """(public Z85, secret Z85 or None) from a ZeroMQ certificate file; checks that the two belong together."""
    text = read_file(path, "CURVE certificate", SecurityError, "create it with `nebula-admin provision`").decode(
        "utf-8", "replace")
    keys: dict[str, str] = {}
    for line in text.splitlines():
        m = _LINE.match(line)
        if m:
            keys[m.group(1)] = m.group(2)
    public, secret = keys.get("public"), keys.get("secret")
    if public is None or len(public) != 40:
        raise SecurityError(f"CURVE certificate {path} has no 40-character public-key line")
    if secret is not None:
        try:
            derived = curve_public_from_secret(secret)
        except ValueError as exc:
            raise SecurityError(f"CURVE certificate {path} has a malformed secret-key ({exc})") from None
        if derived != public:
            raise SecurityError(f"CURVE certificate {path}: secret-key does not belong to public-key")
    return public, secret
