"""The initial model of an empty trail (version 1): the job's `initial_model` file, or the answer most clients
agree on.

Every candidate passes the checks an update passes: tensor names, dtypes among the job's `model_dtypes`, at most
`max_model_bytes`, finite values (the manifest is checked before any piece is taken, so a claimed terabyte costs
nothing). Without a file, the controller asks `initial_clients` connected clients at once (in an order drawn from
the job's seed) and gives each `initial_wait_s`; of the valid answers, the model whose manifest (names, dtypes,
shapes) more than half of them share is taken (the first that arrived of those). A silent, malformed or
poisoned answer only costs the wait: while no manifest has a majority (no valid answer, or a tie), the next
clients are asked. Only a client whose cluster holds the job's grant (the check its updates pass) is asked, and
its answer is taken only if the grant still holds then; a client without one is refused unasked. Each refusal is
audited with its reason. Clients that agree on a manifest can still disagree on
values; to trust no client with the start, name the file.
"""
from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np

from nebula.federated.config import FederatedJob
from nebula.federated.messages import GetParameters, Parameters
from nebula.federated.transport import ActorMessenger
from nebula.messaging import Peer, manifest

__all__ = ["manifest_refusal", "values_refusal", "load_initial_model", "Answer", "majority", "fetch_initial"]

MAX_TENSORS = 100_000
MAX_NAME = 256


def manifest_refusal(tensors: Any, job: FederatedJob) -> str | None:
    """Why a model with this manifest ([name, dtype, shape] entries) cannot be the job's model, or None."""
    if not isinstance(tensors, list) or not 0 < len(tensors) <= MAX_TENSORS:
        return f"the model must list 1 to {MAX_TENSORS} tensors as [name, dtype, shape]"
    names, total = set(), 0
    for t in tensors:
        if not (isinstance(t, list) and len(t) == 3 and isinstance(t[0], str) and 0 < len(t[0]) <= MAX_NAME
                and isinstance(t[1], str) and isinstance(t[2], list) and len(t[2]) <= 32
                and all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in t[2])):
            return f"malformed tensor entry {str(t)[:80]}; each must be [name, dtype, shape]"
        if t[0] in names:
            return f"tensor {t[0][:64]!r} is listed twice"
        names.add(t[0])
        if t[1] not in job.model_dtypes:
            return (f"tensor {t[0][:64]!r} has dtype {t[1][:32]}, the job's model_dtypes are "
                    f"{list(job.model_dtypes)}; list the dtype there if the model really uses it")
        total += np.dtype(t[1]).itemsize * math.prod(t[2])
        if total > job.max_model_bytes:
            return (f"the model is larger than the job's max_model_bytes={job.max_model_bytes} (at tensor "
                    f"{t[0][:64]!r}); raise it in the job file if the model really is that large")
    return None


def values_refusal(weights: Mapping[str, np.ndarray]) -> str | None:
    """Why these values cannot start the job (non-finite), or None."""
    bad = next((k for k, v in weights.items() if not np.isfinite(v).all()), None)
    return None if bad is None else f"{bad[:64]!r} holds NaN or Inf"


def load_initial_model(job: FederatedJob) -> dict[str, np.ndarray]:
    """The job's `initial_model` file (.npz, no pickles), checked; ValueError naming the file and the problem."""
    path = Path(job.initial_model)
    try:
        with np.load(path, allow_pickle=False) as z:
            weights = {k: z[k] for k in z.files}
    except (OSError, ValueError) as exc:
        raise ValueError(f"initial_model {path}: cannot read it as .npz ({exc}); write it with numpy.savez or "
                         "`nebula fl models --export`") from None
    why = manifest_refusal(manifest(weights), job) or values_refusal(weights)
    if why is not None:
        raise ValueError(f"initial_model {path}: {why}")
    return weights


@dataclass(frozen=True, slots=True)
class Answer:
    """One asked client's answer: the manifest of a valid model (as a hashable key), or why it was refused."""

    who: str
    key: tuple | None
    reason: str | None = None


def majority(answers: list[Answer], of: int | None = None) -> tuple | None:
    """The manifest key more than half of the valid answers share (more than half of `of` answers, when given:
    one that the answers still to come cannot outvote), or None."""
    counts: dict[tuple, int] = {}
    for a in answers:
        if a.key is not None:
            counts[a.key] = counts.get(a.key, 0) + 1
    valid = sum(counts.values()) if of is None else of
    best = max(counts.items(), key=lambda kv: kv[1], default=None)
    return best[0] if best is not None and valid and best[1] * 2 > valid else None


def _key(tensors: list) -> tuple:
    return tuple((n, d, tuple(s)) for n, d, s in tensors)


def fetch_initial(mb: ActorMessenger, job: FederatedJob, run: str, roster: Callable[[], Mapping[Peer, int]],
                  audit: Callable[[str, str, dict], None],
                  refusal: Callable[[Peer], str | None] = lambda _: None) -> tuple[dict[str, np.ndarray], str]:
    """(weights, the client they came from): ask clients as the module says; `roster()` gives the connected
    clients now, `audit(client, outcome, detail)` records an answer, `refusal(client)` says why a client's
    cluster grants it no part in the job (None: granted). RuntimeError when every connected client was asked
    and no manifest has a majority."""
    asked: set[Peer] = set()
    answers: list[Answer] = []
    models: dict[tuple, tuple[str, dict[str, np.ndarray]]] = {}
    want = job.initial_clients
    while True:
        current = set(roster())
        for p in sorted(current - asked):
            why = refusal(p)
            if why is not None:  # never asked: its model could not be taken
                asked.add(p)
                why = f"not asked for the initial model: {why}"
                audit(str(p), "refused", {"reason": why})
                answers.append(Answer(str(p), None, why))
        left = sorted(current - asked)
        random.Random(job.seed * 7919 + len(asked)).shuffle(left)
        batch = left[:want]
        if not batch:
            reasons = "; ".join(f"{a.who}: {a.reason}" for a in answers if a.reason)[:600]
            raise RuntimeError(f"no initial model: {len(asked)} clients asked, no model has a majority of the valid "
                               f"answers ({reasons or 'ties'}); name one in the job file (initial_model: FILE.npz)")
        asked.update(batch)
        got = _ask(mb, job, run, batch, audit, refusal)
        answers += [a for a, _ in got]
        for a, w in got:
            if a.key is not None and a.key not in models:
                models[a.key] = (a.who, w)
        key = majority(answers)
        if key is not None:
            who, weights = models[key]
            audit(who, "accepted", {"agreeing": sum(a.key == key for a in answers), "answers": len(answers)})
            return weights, who
        want = job.initial_clients if not any(a.key for a in answers) else 1  # none valid yet, or a tie to break


def _ask(mb: ActorMessenger, job: FederatedJob, run: str, batch: list[Peer], audit: Callable[[str, str, dict], None],
         refusal: Callable[[Peer], str | None] = lambda _: None) -> list[tuple[Answer, dict[str, np.ndarray] | None]]:
    """Ask `batch` at once; each answer checked (its cluster's grant, then manifest, then the values) within
    `initial_wait_s`."""
    for p in batch:
        mb.send(p, GetParameters(run=run))
    deadline = time.monotonic() + job.initial_wait_s
    out: list[tuple[Answer, dict[str, np.ndarray] | None]] = []
    pending = set(batch)
    while pending and time.monotonic() < deadline:
        if majority([a for a, _ in out], of=len(batch)) is not None:
            return out  # the rest cannot outvote it: not waited for
        got = mb.poll(sorted(pending), deadline - time.monotonic())
        if got is None:
            break
        peer, msg, parts = got
        if not isinstance(msg, Parameters) or msg.run != run:
            continue  # not an answer to this question (of an earlier run, say)
        pending.discard(peer)
        weights = None
        why = refusal(peer)
        why = (f"its cluster no longer grants it the job: {why}" if why is not None else
               manifest_refusal(None if msg.model is None else msg.model.tensors, job))
        if why is None:
            try:
                weights = mb.recv_model(peer, msg, max(0.0, deadline - time.monotonic()), inline=parts)
                why = values_refusal(weights)
            except (TimeoutError, ValueError) as exc:
                why = f"incomplete model: {exc}"
        if why is not None:
            audit(str(peer), "refused", {"reason": why})
            out.append((Answer(str(peer), None, why), None))
        else:
            out.append((Answer(str(peer), _key(manifest(weights))), weights))
    for p in sorted(pending):
        why = f"no answer within initial_wait_s={job.initial_wait_s:g}"
        audit(str(p), "silent", {"reason": why})
        out.append((Answer(str(p), None, why), None))
    return out
