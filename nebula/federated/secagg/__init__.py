"""Secure aggregation (SecAgg+, Bell et al., CCS 2020) as pure protocol state: a combiner learns only the sum of
its clients' updates, the reducer only sums of sums.

Parties: `SecAggClient` (one per client per round) and `SecAggServer` (the combiner); the typed messages of
`messages` pass between them through whatever transport the caller has. The math lives beside them: `crypto`
(X25519, AES-GCM, AES-CTR masks), `shamir` (GF(2^521 − 1)), `vss` (Feldman commitments over a 2048-bit Schnorr
group of order 2^521 − 1: each share checked by its holder, each rebuilt secret by the server), `graph` (Harary
graph, degree, threshold), `quantize` (fixed point mod 2^b, public bounded weights, the sum's range check),
`compose` (strategies, codecs, the reducer), `vouch` (certificate-backed signatures: who vouches for a key, a set
of share commitments, a weight or a survivor set) and `config` (the job-file section, γ and δ, the signers).
"""
from nebula.federated.secagg.client import SecAggClient
from nebula.federated.secagg.compose import (PROTOCOLS, check_codec_precision, check_strategy, flatten, partial_mean,
                                             reduce_sums, unflatten, word_bits_for_codec)
from nebula.federated.secagg.config import UNMASK_STAGES, SecAggConfig
from nebula.federated.secagg.graph import default_degree, harary_graph, majority_threshold
from nebula.federated.secagg.client import Journal, MemoryJournal
from nebula.federated.secagg.messages import (AdvertiseKeys, Complaint, DealerCommitments, EncryptedShare, KeyRoster,
                                              MaskedInput, SecAggParams, SecAggRefused, SecureSum, ShareCheck,
                                              ShareDelivery, ShareKeys, ShareVerdict, SurvivorSet, SurvivorSignature,
                                              UnmaskRequest, UnmaskResponse, model_digest)
from nebula.federated.secagg.vouch import Signer, Verifier, load_signer, load_verifier
from nebula.federated.secagg.quantize import Quantizer
from nebula.federated.secagg.server import SecAggServer

__all__ = ["SecAggClient", "SecAggServer", "SecAggConfig", "UNMASK_STAGES", "SecAggParams", "SecAggRefused",
           "Quantizer",
           "AdvertiseKeys", "KeyRoster", "EncryptedShare", "DealerCommitments", "ShareKeys", "ShareDelivery",
           "Complaint", "ShareCheck", "ShareVerdict", "MaskedInput", "UnmaskRequest", "UnmaskResponse", "SecureSum",
           "SurvivorSet", "SurvivorSignature", "model_digest", "Journal", "MemoryJournal", "Signer", "Verifier",
           "load_signer", "load_verifier", "PROTOCOLS", "check_strategy", "word_bits_for_codec",
           "check_codec_precision", "flatten", "unflatten", "reduce_sums", "partial_mean", "default_degree",
           "harary_graph", "majority_threshold"]
