"""The controller with the reducer (FEDn §3.4): one per federation, it runs the rounds and keeps the model trail.

`Controller` (`.controller`) runs the synchronous rounds and hands asynchronous strategies to `.asynchronous`; what it
is around the rounds (run identity, the combiners' status, grants, witnesses, the initial model) is `.base`; a
round's reduction as pure state is `.reduction`, its privacy (sampling, server noise, the budget) `.privacy`; what
the job's secure aggregation and differential privacy make of a round, chosen once with a no-op for each when off,
is `.capabilities`; the models it released are the `.trail`, the combiners' checkpoints it pinned their `.witness`.
"""
from nebula.federated.controller.controller import REPORT_GRACE_S, Controller
from nebula.federated.controller.privacy import STOPPED, RoundPrivacy
from nebula.federated.controller.reduction import Reduction
from nebula.federated.controller.trail import ModelRecord, ModelTrail, RoundRecord
from nebula.federated.controller.witness import CombinerWitness

__all__ = ["Controller", "REPORT_GRACE_S", "RoundPrivacy", "STOPPED", "Reduction", "ModelTrail", "ModelRecord",
           "RoundRecord", "CombinerWitness"]
