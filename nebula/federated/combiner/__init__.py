"""The combiner: one per cluster, behind its switch, between the reducer and its cluster's clients.

`Combiner` (`.combiner`) serves the controller's commands; what it is between rounds (hellos, grants, refusals) is
`.base`; a synchronous round is `.rounds.SyncRound` around the pure `.round_state.RoundState`, with secure
aggregation `.secure.SecureRound` around `.secure_state.SecureRoundState`; an asynchronous run is
`.rounds.serve_async`. Which round serves a job and how it folds each update (differential privacy) is chosen once
from the job file in `.capabilities`.
"""
from nebula.federated.combiner.combiner import Combiner
from nebula.federated.combiner.round_state import RoundState
from nebula.federated.combiner.rounds import SyncRound, serve_async
from nebula.federated.combiner.secure import SecureRound
from nebula.federated.combiner.secure_state import SecureRoundState

__all__ = ["Combiner", "RoundState", "SyncRound", "serve_async", "SecureRound", "SecureRoundState"]
