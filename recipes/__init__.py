"""Runnable jobs built on nebula's public API (abnet, electra, federated, balance)."""
