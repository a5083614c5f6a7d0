"""A federated client: the API users write against (`Client`, `.api`), a Paddle helper and the loop that serves its
combiner's tasks (`.client`, with `task_answer`: how the client answers a task, chosen once from its job file), the
waiting for its combiner's answers every task shares (`.answers`), and its part of a round with secure aggregation
(`.secure`).
"""
from nebula.federated.client.api import Client
from nebula.federated.client.client import PaddleClient, load_client, run_client

__all__ = ["Client", "PaddleClient", "load_client", "run_client"]
