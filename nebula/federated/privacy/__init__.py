"""Differential privacy for the federated mode: client-level DP-FedAvg (clipping, Gaussian noise placed centrally,
locally or distributed across the clients of a secure sum) and an accountant from `dp-accounting`; what a client
does to its update before it leaves (`release`: `AsTrained` without DP, `Privatize` with it).

The accountant (and `dp-accounting`, about a second to import) loads on first use: a job file with a
`differential_privacy` section is read, and a client clips and adds its noise, without it."""
from __future__ import annotations

import importlib
from typing import Any

from nebula.federated.privacy.mechanism import (ACCOUNTANTS, DP_MODES, SAMPLERS, DPConfig, add_gaussian_noise,
                                                clip_factor, clip_update, client_noise_std, noise_rng,
                                                privatize_update, privatize_weights, server_noise_std,
                                                update_norm)
from nebula.federated.privacy.release import AsTrained, Privatize

__all__ = ["DPConfig", "DP_MODES", "ACCOUNTANTS", "SAMPLERS", "clip_update", "clip_factor", "update_norm",
           "client_noise_std", "server_noise_std", "add_gaussian_noise", "privatize_update", "privatize_weights",
           "noise_rng", "AsTrained", "Privatize", "PrivacyAccountant", "BudgetStatus", "sampling_rate_for",
           "accountant_for", "noise_for_epsilon"]

_LAZY = {"PrivacyAccountant", "BudgetStatus", "sampling_rate_for", "accountant_for", "noise_for_epsilon"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module("nebula.federated.privacy.accountant"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
