"""Exceptions of the security layer; every message names the thing that is wrong and how to fix it."""
from __future__ import annotations

__all__ = [
    "SecurityError",
    "IdentityError",
    "CAError",
    "TLSConfigError",
    "AuditError",
    "AccountError",
    "AccountLocked",
    "AuthenticationFailed",
    "AccessDenied",
]


class SecurityError(Exception):
    """Base class: a security operation failed; the message says what and how to fix it."""


class IdentityError(SecurityError, ValueError):
    """A name, role or identity URI is malformed."""


class CAError(SecurityError):
    """Certificate authority operation failed (missing files, wrong passphrase, unknown serial, ...)."""


class TLSConfigError(SecurityError):
    """A CA, certificate, key or CRL file cannot be used to build a TLS context."""


class AuditError(SecurityError):
    """The audit log or a checkpoint cannot be written, read or verified."""


class AccountError(SecurityError):
    """Account or grant operation failed (unknown user, duplicate name, bad expiry, ...)."""


class AuthenticationFailed(AccountError):
    """Wrong password (the failure is counted towards lockout)."""


class AccountLocked(AccountError):
    """The account is locked after repeated failures or by an admin."""


class AccessDenied(AccountError):
    """Access to another account's resource without a valid grant."""
