"""Federation identities: `spiffe://<federation>/<role>/<cluster>/<name>` carried in a certificate's SAN URI."""
from __future__ import annotations

import re
from dataclasses import dataclass

from cryptography import x509

from security._text import safe_text
from security.errors import IdentityError

__all__ = ["ROLES", "NO_CLUSTER", "Identity", "identity_of", "check_name"]

ROLES = ("switch", "worker", "admin", "user")
NO_CLUSTER = "-"  # path segment for identities that belong to no cluster (admins, users)
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")  # fullmatch: `$` would let a trailing newline through


def check_name(value: str, what: str) -> str:
    """Return `value` if it is a valid name (letters, digits, `.`, `_`, `-`; 1-63 chars), else raise IdentityError."""
    if not isinstance(value, str) or not _NAME.fullmatch(value):
        shown = f"'{safe_text(value, 80)}'" if isinstance(value, str) else safe_text(repr(value), 80)
        raise IdentityError(
            f"{what} {shown} is not a valid name; use 1-63 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit"
        )
    return value


@dataclass(frozen=True, slots=True)
class Identity:
    """Who a certificate speaks for: federation, role, cluster (None for admins/users without one) and name."""

    federation: str
    role: str
    cluster: str | None
    name: str

    def __post_init__(self) -> None:
        check_name(self.federation, "federation")
        if self.role not in ROLES:
            raise IdentityError(f"role {self.role!r} is unknown; use one of {', '.join(ROLES)}")
        if self.cluster is not None:
            check_name(self.cluster, "cluster")
        elif self.role in ("switch", "worker"):
            raise IdentityError(f"role {self.role!r} needs a cluster; pass --cluster NAME")
        check_name(self.name, "name")

    @property
    def uri(self) -> str:
        """The SPIFFE-style URI placed in the certificate's SAN."""
        return f"spiffe://{self.federation}/{self.role}/{self.cluster or NO_CLUSTER}/{self.name}"

    @classmethod
    def parse(cls, uri: str) -> "Identity":
        """Parse `spiffe://federation/role/cluster/name` (cluster `-` means none)."""
        prefix = "spiffe://"
        if not isinstance(uri, str) or not uri.startswith(prefix):
            raise IdentityError(f"identity URI {uri!r} must start with {prefix}")
        parts = uri[len(prefix):].split("/")
        if len(parts) != 4:
            raise IdentityError(
                f"identity URI {uri!r} must have the form spiffe://<federation>/<role>/<cluster>/<name>"
            )
        federation, role, cluster, name = parts
        return cls(federation, role, None if cluster == NO_CLUSTER else cluster, name)

    def __str__(self) -> str:
        return self.uri


def identity_of(cert: x509.Certificate) -> Identity:
    """The identity in `cert`'s SAN URI; raise IdentityError if there is none or more than one."""
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        raise IdentityError(
            f"certificate serial {cert.serial_number:x} has no subjectAltName; issue it with nebula-admin"
        ) from None
    uris = [u for u in san.get_values_for_type(x509.UniformResourceIdentifier) if u.startswith("spiffe://")]
    if len(uris) != 1:
        raise IdentityError(
            f"certificate serial {cert.serial_number:x} carries {len(uris)} spiffe:// URIs, expected exactly one; "
            "issue it with nebula-admin"
        )
    return Identity.parse(uris[0])
