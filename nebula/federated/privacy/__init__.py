"""Differential privacy for the federated mode: client-level DP-FedAvg (clipping, Gaussian noise placed centrally,
locally or distributed across the clients of a secure sum) and an accountant from `dp-accounting`."""
from nebula.federated.privacy.accountant import BudgetStatus, PrivacyAccountant, sampling_rate_for
from nebula.federated.privacy.mechanism import (ACCOUNTANTS, DP_MODES, DPConfig, add_gaussian_noise, clip_update,
                                                client_noise_std, noise_rng, privatize_update, server_noise_std,
                                                update_norm)

__all__ = ["DPConfig", "DP_MODES", "ACCOUNTANTS", "clip_update", "update_norm", "client_noise_std",
           "server_noise_std", "add_gaussian_noise", "privatize_update", "noise_rng", "PrivacyAccountant",
           "BudgetStatus", "sampling_rate_for"]
