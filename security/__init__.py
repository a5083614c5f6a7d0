"""Security layer: certificate authority and lifecycle, TLS contexts, accounts and grants, tamper-evident audit log.

Submodules (import what you need): `identity`, `ca`, `tls`, `preflight`, `audit`, `audit_verify`, `audit_evidence`,
`curve`, `provision`, `accounts`, `routes`, `cli`.
"""
from security._files import atomic_write
from security.errors import (
    AccessDenied,
    AccountError,
    AccountLocked,
    AuditError,
    AuthenticationFailed,
    CAError,
    IdentityError,
    SecurityError,
    TLSConfigError,
)
from security.identity import ROLES, Identity, identity_of

__all__ = [
    "atomic_write",
    "AccessDenied",
    "AccountError",
    "AccountLocked",
    "AuditError",
    "AuthenticationFailed",
    "CAError",
    "IdentityError",
    "SecurityError",
    "TLSConfigError",
    "ROLES",
    "Identity",
    "identity_of",
]
