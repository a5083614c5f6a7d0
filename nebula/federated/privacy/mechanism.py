"""Client-level DP-FedAvg (McMahan et al., ICLR 2018): clip each client's change, add Gaussian noise to the sum.

Each client scales its whole change Δ (all tensors as one vector) to L2 norm ≤ C = `clip_norm`; under central DP
the combiner scales every update it folds again (`clip_update`, on the decoded change: what is aggregated), so a
client that skips its own clipping moves the sum no further. The aggregate S = Σ_i w_i·clip(Δ_i), with weights
w_i ≤ 1, changes by at most C in L2 when one client joins or leaves (add/remove adjacency) and by at most 2C when one
client's data is replaced by another's (replace-one adjacency). Gaussian noise N(0, (z·C)²) on S, z =
`noise_multiplier`, is the Gaussian mechanism with noise multiplier z under add/remove and z/2 under replace-one;
the accountant composes it over rounds with the adjacency the sampler and the mode call for
(`nebula.federated.privacy.accountant`).

Who takes part (`sampler`, central DP): `poisson` (each client independently with probability q = clients_per_round
/ clients, from the OS's randomness; add/remove adjacency, sensitivity C) or `fixed` (exactly clients_per_round of
the job's clients, uniformly without replacement; accounted by sampling without replacement, which holds for
replace-one adjacency only: sensitivity 2C). Under central DP the released mean is the noisy sum divided by
clients_per_round, the expected count, never by the count that took part (McMahan et al.'s fixed-denominator
estimator), so the model does not give away how many clients were drawn.

Where the noise goes (`mode`):
  central      the reducer adds N(0, (zC)²) to the sum of the combiners' sums: private against whoever sees the
               models, but the combiners (and the reducer) see exact sums. Sampling amplifies it.
  local        each client adds N(0, (zC)²) to its own clipped change before sending: private against every
               server, at n times the noise variance of central DP. No amplification (the server saw who sent), and
               the adjacency is replace-one (whether a client took part is no secret): sensitivity 2C.
  distributed  for secure aggregation, where no server ever sees a single update and nobody should add the noise
               after seeing the sum: each client adds N(0, (zC)²/t) with t the least number of clients whose sum a
               combiner can unmask (the SecAgg+ threshold), so any sum that comes out carries at least (zC)², and
               more when more survive. Each combiner's sum is private on its own, against that combiner; the
               reducer's total then holds the noise of every combiner. The continuous-Gaussian analysis is applied
               to the sum before fixed-point rounding, whose step (1/scale ≈ 1e−7·clip_range) is far below the noise;
               the exact discrete analysis (Kairouz et al. 2021, distributed discrete Gaussian) is not claimed.
               As under local DP the aggregator saw who sent: no amplification, replace-one, sensitivity 2C.

The mean's denominator must not depend on one client's data beyond what the aggregator sees anyway: under DP use
`max_weight: 1` (unweighted, the denominator is the number of survivors, which the aggregator knows) or a fixed
expected total weight (McMahan et al.'s f̃_f estimator).
Noise comes from numpy's PCG64 seeded with 128 bits from the OS; floating-point Gaussian sampling is not hardened
against the attacks of Mironov (2012) and Jin et al. (2022).
"""
from __future__ import annotations

import math
import secrets
from dataclasses import dataclass
from typing import Mapping

import numpy as np

__all__ = ["DPConfig", "DP_MODES", "ACCOUNTANTS", "SAMPLERS", "clip_update", "clip_factor", "update_norm",
           "client_noise_std", "server_noise_std", "add_gaussian_noise", "privatize_update", "privatize_weights",
           "noise_rng"]

DP_MODES = ("central", "local", "distributed")
ACCOUNTANTS = ("rdp", "pld")
SAMPLERS = ("poisson", "fixed")


@dataclass(frozen=True, kw_only=True, slots=True)
class DPConfig:
    """The `differential_privacy` section of a federated job file."""

    clip_norm: float
    noise_multiplier: float
    mode: str = "central"
    delta: float = 1e-5
    target_epsilon: float | None = None
    accountant: str = "rdp"
    sampler: str = "poisson"  # how the controller draws a round's clients (module docstring)

    def __post_init__(self) -> None:
        if not (math.isfinite(self.clip_norm) and self.clip_norm > 0):
            raise ValueError(f"differential_privacy.clip_norm={self.clip_norm} must be > 0 (the L2 bound on one "
                             "client's change, e.g. the median norm of an unclipped round)")
        if not (math.isfinite(self.noise_multiplier) and self.noise_multiplier > 0):
            raise ValueError(f"differential_privacy.noise_multiplier={self.noise_multiplier} must be > 0 (noise "
                             "std / clip_norm; about 1 gives single-digit epsilon over hundreds of sampled rounds)")
        if self.mode not in DP_MODES:
            raise ValueError(f"differential_privacy.mode={self.mode!r} is not one of {', '.join(DP_MODES)}")
        if not 0 < self.delta < 1:
            raise ValueError(f"differential_privacy.delta={self.delta} must be in (0, 1), below 1/population")
        if self.target_epsilon is not None and not self.target_epsilon > 0:
            raise ValueError(f"differential_privacy.target_epsilon={self.target_epsilon} must be > 0 or left out")
        if self.accountant not in ACCOUNTANTS:
            raise ValueError(f"differential_privacy.accountant={self.accountant!r} is not one of "
                             f"{', '.join(ACCOUNTANTS)}")
        if self.sampler not in SAMPLERS:
            raise ValueError(f"differential_privacy.sampler={self.sampler!r} is not one of {', '.join(SAMPLERS)} "
                             "(poisson: each client with probability clients_per_round / clients; fixed: exactly "
                             "clients_per_round of them)")
        if self.sampler == "fixed" and self.accountant == "pld" and self.mode == "central":
            raise ValueError("differential_privacy.sampler=fixed with accountant=pld: dp-accounting's PLD accountant "
                             "has no analysis of sampling without replacement; use accountant: rdp or sampler: "
                             "poisson")


def update_norm(update: Mapping[str, np.ndarray]) -> float:
    """L2 norm of all tensors of `update` taken as one vector."""
    return math.sqrt(sum(float(np.dot(v.ravel().astype(np.float64), v.ravel().astype(np.float64)))
                         for v in update.values()))


def clip_factor(norm: float, clip_norm: float) -> float:
    """The factor that scales a change of L2 norm `norm` to at most `clip_norm` (1 when it is within)."""
    if not math.isfinite(norm):
        raise ValueError(f"an update's L2 norm is {norm}, not finite; it cannot be clipped and is refused")
    return min(1.0, clip_norm / norm) if norm > 0 else 1.0


def clip_update(update: Mapping[str, np.ndarray], clip_norm: float) -> tuple[dict[str, np.ndarray], float]:
    """(`update` scaled to L2 norm ≤ `clip_norm`, its norm before): one factor for all tensors."""
    norm = update_norm(update)
    factor = clip_factor(norm, clip_norm)
    return {k: (np.asarray(v, np.float64) * factor).astype(np.asarray(v).dtype) for k, v in update.items()}, norm


def client_noise_std(cfg: DPConfig, min_clients: int = 1) -> float:
    """Std of the noise one client adds: zC (local), zC/√t for t = `min_clients` (distributed), 0 (central)."""
    if cfg.mode == "local":
        return cfg.noise_multiplier * cfg.clip_norm
    if cfg.mode == "distributed":
        if min_clients < 1:
            raise ValueError(f"distributed DP needs the least number of clients in a sum, got {min_clients}")
        return cfg.noise_multiplier * cfg.clip_norm / math.sqrt(min_clients)
    return 0.0


def server_noise_std(cfg: DPConfig) -> float:
    """Std of the noise the reducer adds to the sum: zC under central DP, else 0."""
    return cfg.noise_multiplier * cfg.clip_norm if cfg.mode == "central" else 0.0


def noise_rng() -> np.random.Generator:
    """A generator seeded with 128 bits from the OS (never a fixed seed: the noise must be unpredictable)."""
    return np.random.Generator(np.random.PCG64(secrets.randbits(128)))


def add_gaussian_noise(update: Mapping[str, np.ndarray], std: float,
                       rng: np.random.Generator) -> dict[str, np.ndarray]:
    """`update` plus N(0, std²) on every coordinate (computed in float64, returned in each tensor's dtype)."""
    if std == 0:
        return dict(update)
    return {k: (np.asarray(v, np.float64) + rng.normal(0.0, std, np.shape(v))).astype(np.asarray(v).dtype)
            for k, v in update.items()}


def privatize_update(update: Mapping[str, np.ndarray], cfg: DPConfig, rng: np.random.Generator,
                     min_clients: int = 1) -> tuple[dict[str, np.ndarray], float]:
    """A client's part: clip its change, then add its share of the noise; (sent change, norm before clipping)."""
    clipped, norm = clip_update(update, cfg.clip_norm)
    return add_gaussian_noise(clipped, client_noise_std(cfg, min_clients), rng), norm


def privatize_weights(dp: DPConfig, params: Mapping[str, np.ndarray], weights: Mapping[str, np.ndarray],
                      rng: np.random.Generator, min_clients: int = 1) -> dict[str, np.ndarray]:
    """The weights to send under differential privacy: the round's model plus the change clipped to clip_norm and
    noised as the mode says. ValueError when `weights` is not shaped like the model (nothing unclipped leaves)."""
    if [(k, np.shape(v)) for k, v in weights.items()] != [(k, np.shape(v)) for k, v in params.items()]:
        raise ValueError("the trained model's tensors differ from the round's model; nothing is sent")
    change = {k: np.asarray(weights[k], np.float64) - params[k] for k in params}
    sent, _ = privatize_update(change, dp, rng, min_clients)
    return {k: (params[k] + sent[k]).astype(params[k].dtype) for k in params}
