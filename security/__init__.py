"""Security layer: certificate authority and lifecycle, TLS contexts, accounts and grants, tamper-evident audit log."""
