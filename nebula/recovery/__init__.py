"""Recovery of a job from the loss of a cluster: checkpoints a kill cannot leave loading wrong (`durable`)."""
from nebula.recovery.durable import CheckpointError

__all__ = ["CheckpointError"]
