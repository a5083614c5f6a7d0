"""Recovery of a job from the loss of a cluster: checkpoints a kill cannot leave loading wrong (`durable`), and the
agreement by which every cluster, after one was lost and launched again, resumes from the newest checkpoint all
hold (`messages`, the pure state machine `protocol`; `driver` runs it over the job's channels)."""
from nebula.recovery.durable import CheckpointError
from nebula.recovery.messages import (Decided, Holdings, Incarnation, RecoveryRefused, Round, decode_recovery,
                                      encode_recovery)
from nebula.recovery.protocol import (RESTART_HINT, Agreement, GiveUp, Paused, Received, Renumbered, RequestPause,
                                      Resume, Send, Started, Superseded, Tick)

__all__ = ["CheckpointError", "Decided", "Holdings", "Incarnation", "RecoveryRefused", "Round", "decode_recovery",
           "encode_recovery", "RESTART_HINT", "Agreement", "GiveUp", "Paused", "Received", "Renumbered",
           "RequestPause", "Resume", "Send", "Started", "Superseded", "Tick"]
