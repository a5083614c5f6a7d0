"""Password hashes (scrypt) and a check whose work does not depend on whose password is checked.

A login that ran the KDF only at the stored hash's cost would tell an attacker, by its time, which user names exist
(an unknown name costs the default) and which were made with another cost. `check_evenly` runs scrypt once at
every cost the store holds, whatever the user: the one matching the stored hash with its salt, the others with a
random one, so an existing, locked or unknown user, of any cost, costs the same.
"""
from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from typing import Iterable

__all__ = ["SCRYPT_N", "SCRYPT_R", "SCRYPT_P", "Cost", "hash_password", "verify_password", "cost_of",
           "check_evenly"]

SCRYPT_N = 2**17  # OWASP's recommended cost for scrypt (128 MiB with r=8)
SCRYPT_R = 8
SCRYPT_P = 1
Cost = tuple[int, int, int]  # scrypt (n, r, p)
_DKLEN = 32


def hash_password(password: str, *, n: int = SCRYPT_N, r: int = SCRYPT_R, p: int = SCRYPT_P) -> str:
    """scrypt hash of `password` with a random salt, as `scrypt$n$r$p$salt$hash` (base64)."""
    salt = secrets.token_bytes(16)
    digest = _scrypt(password, salt, (n, r, p), _DKLEN)
    b64 = [base64.b64encode(v).decode() for v in (salt, digest)]
    return "$".join(["scrypt", str(n), str(r), str(p), *b64])


def _maxmem(n: int, r: int, p: int) -> int:
    return 128 * r * (n + p + 2) + (1 << 20)


def _scrypt(password: str, salt: bytes, cost: Cost, dklen: int) -> bytes:
    n, r, p = cost
    return hashlib.scrypt(password.encode(), salt=salt, n=n, r=r, p=p, maxmem=_maxmem(n, r, p), dklen=dklen)


def _parse(stored: str) -> tuple[Cost, bytes, bytes] | None:
    try:
        scheme, n, r, p, salt, digest = stored.split("$")
        cost = (int(n), int(r), int(p))
        salt_b, want = base64.b64decode(salt), base64.b64decode(digest)
    except (ValueError, AttributeError):
        return None
    return (cost, salt_b, want) if scheme == "scrypt" and want else None


def cost_of(stored: str) -> Cost | None:
    """The (n, r, p) scrypt cost of a stored hash; None if it is not one."""
    parsed = _parse(stored)
    return None if parsed is None else parsed[0]


def verify_password(password: str, stored: str) -> bool:
    """True if `password` matches the stored scrypt hash (constant-time comparison)."""
    parsed = _parse(stored)
    if parsed is None:
        return False
    cost, salt, want = parsed
    return hmac.compare_digest(_scrypt(password, salt, cost, len(want)), want)


def check_evenly(password: str, stored: str | None, costs: Iterable[Cost]) -> bool:
    """True if `password` matches `stored` (None: an unknown user). scrypt runs once for each cost in `costs` plus
    the stored hash's own, in a fixed order: with the stored salt at the stored cost, a random salt at the others.
    Pass every cost the store holds, so that the work does not depend on `stored`."""
    parsed = None if stored is None else _parse(stored)
    ok = False
    for cost in sorted(set(costs) | ({parsed[0]} if parsed else set())):
        if parsed is not None and cost == parsed[0]:
            _, salt, want = parsed
            ok = hmac.compare_digest(_scrypt(password, salt, cost, len(want)), want)
        else:
            hmac.compare_digest(_scrypt(password, secrets.token_bytes(16), cost, _DKLEN), secrets.token_bytes(_DKLEN))
    return ok
