"""What the account store hands out: accounts, namespace grants, and the one form of a namespace resource path."""
from __future__ import annotations

from dataclasses import dataclass

from security._text import safe_text
from security._time import Lifecycle
from security.errors import AccountError

__all__ = ["Account", "Grant", "namespace_resource"]


@dataclass(frozen=True, slots=True)
class Account:
    """One account as listed: never carries the password hash."""

    name: str
    role: str
    locked: bool
    failed_attempts: int
    created: str


@dataclass(frozen=True, slots=True)
class Grant(Lifecycle):
    """Read access for `grantee` to `resource` (a path in `owner`'s namespace, or a directory prefix of it)."""

    id: int
    owner: str
    grantee: str
    resource: str
    created: str
    expires: str | None
    revoked: str | None

    def covers(self, resource: str) -> bool:
        """True if this grant's resource is `resource` or a directory that contains it."""
        return resource == self.resource or resource.startswith(self.resource.rstrip("/") + "/")


def namespace_resource(resource: str) -> str:
    """Normalised relative resource path; rejects absolute paths and `..` (no escape from a namespace)."""
    if not isinstance(resource, str) or not resource.strip("/"):
        raise AccountError(f"resource {_shown(resource)} is empty; name a path inside the owner's namespace, "
                           "e.g. data/x")
    parts = [p for p in resource.split("/") if p not in ("", ".")]
    if resource.startswith("/") or ".." in parts:
        raise AccountError(f"resource {_shown(resource)} must be a relative path inside the owner's namespace "
                           "(no leading / and no ..), e.g. data/corpus.txt")
    return "/".join(parts)


def _shown(resource: object) -> str:
    return f"'{safe_text(resource, 120)}'" if isinstance(resource, str) else safe_text(repr(resource), 120)
