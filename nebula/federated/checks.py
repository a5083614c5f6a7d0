"""The combiner's rules for what a client sends, as pure functions: each returns why a message must be refused (a
`Refusal`: a kind that refusals are counted by, and one line with the fix), or None.

A client chooses every value of its hello and its update headers; each is bounded here by what the combiner knows
(its job, the round in progress, the model it sent, the job's limits) before a byte of a model is taken.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from nebula.federated.messages import TO_COMBINER, ClientHello, ClientUpdate
from nebula.messaging import ProtocolError, decode

__all__ = ["Refusal", "check_update_header", "check_hello", "check_received", "NONCE_CHARS"]

NONCE_CHARS = 64


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a message is refused: `kind` (a small fixed set: what refusals are counted by) and the one-line reason."""

    kind: str
    reason: str

    def __str__(self) -> str:
        return self.reason


def check_update_header(head: ClientUpdate | Mapping[str, Any], *, job: str, round: int, version: int,
                        known_version: int, expected: set[str], seen: set[str], who: str, tensors: list,
                        max_examples: int) -> Refusal | None:
    """Why this update (decoded, or its header as sent) must be refused, or None. `known_version` is the newest
    model version the actor knows, `max_examples` the job's max_examples_per_client."""
    if not isinstance(head, ClientUpdate):
        try:
            head = decode(dict(head), TO_COMBINER)
        except ProtocolError as exc:
            return Refusal("malformed", str(exc))
        if not isinstance(head, ClientUpdate):
            return Refusal("malformed", f"a {head.TYPE} is not an update")
    layout = head.model
    if head.pushed and not (layout is not None and layout.inline):
        return Refusal("malformed", "a pushed update must carry its pieces inside the header's message (inline); "
                       "update the client")
    if head.job != job:
        return Refusal("job", f"update belongs to job {_show(head.job)}, not {job!r}; start the client "
                       "with this job's file")
    v = head.version
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        return Refusal("version", f"unknown model version {_show(v)}; train from a version the combiner sent")
    if v > known_version:
        return Refusal("version", f"future model version {v} (newest is {known_version}); train from a version "
                       "the combiner sent")
    if head.round != round or v != version:
        return Refusal("late", f"late: trained for round {_show(head.round)} from version {v}, the round "
                       f"in progress is {round} (version {version}); a synchronous round never averages updates of "
                       "another round")
    if who not in expected:
        return Refusal("uninvited", f"not asked to take part in round {round}; wait for a task")
    if who in seen:
        return Refusal("duplicate", f"duplicate update in round {round}; send one update per round")
    n = head.num_examples
    if isinstance(n, bool) or not isinstance(n, int) or n <= 0:
        return Refusal("examples", f"num_examples={_show(n)} must be a positive integer")
    if n > max_examples:
        return Refusal("examples", f"num_examples={n} exceeds the job's max_examples_per_client={max_examples}; "
                       "raise it in the job file if clients really hold that many")
    why = _tensor_refusal(None if layout is None else layout.tensors, tensors)
    return None if why is None else Refusal("tensors", why)


def check_hello(hello: ClientHello, *, job: str, max_examples: int) -> Refusal | None:
    """Why a client's hello must be refused (no nonce, another job, an example count out of bounds), or None."""
    n, nonce = hello.num_examples, hello.nonce
    if not isinstance(nonce, str) or not 0 < len(nonce) <= NONCE_CHARS:
        return Refusal("hello", "hello without a nonce (a string of at most 64 characters); update the client")
    if hello.job != job:
        return Refusal("hello", f"hello for job {str(hello.job)[:64]!r}, this is {job!r}")
    if isinstance(n, bool) or not isinstance(n, int) or not 0 < n <= max_examples:
        return Refusal("hello", f"num_examples={str(n)[:32]} must be a positive integer of at most the job's "
                                f"max_examples_per_client={max_examples}")
    return None


def check_received(w: Mapping[str, np.ndarray], latest: Mapping[str, np.ndarray], max_norm: float | None
                   ) -> Refusal | None:
    """Why a received asynchronous update must be refused: non-finite values, or a change from the newest model
    the combiner holds over `max_norm`."""
    from nebula.federated.intake import change_sumsq

    bad = next((k for k, v in w.items() if not np.isfinite(v).all()), None)
    if bad is not None:
        return Refusal("values", f"{bad!r} holds NaN or Inf; lower the learning rate or clip gradients")
    if max_norm is not None:
        norm = np.sqrt(sum(change_sumsq(v.reshape(-1), latest[k].reshape(-1)) for k, v in w.items()))
        if norm > max_norm:
            return Refusal("norm", f"the update's change from the newest model has an L2 norm of {norm:.4g}, over "
                                   f"the job's max_update_norm={max_norm:g}; lower the learning rate or clip it")
    return None


def _tensor_refusal(got: Any, tensors: list) -> str | None:
    tensors = [[t[0], t[1], list(t[2])] for t in tensors]
    if got == tensors:
        return None
    if not isinstance(got, list) or not all(
            isinstance(t, list) and len(t) == 3 and isinstance(t[0], str) and isinstance(t[1], str)
            and isinstance(t[2], list) for t in got):
        return "malformed tensors list (each entry must be [name, dtype, shape]); send models with Messenger.send_model"
    have, theirs = {t[0]: t for t in tensors}, {t[0]: t for t in got}
    missing, extra = sorted(set(have) - set(theirs)), sorted(set(theirs) - set(have))
    if missing or extra:
        return f"keys differ from the global model's (missing {_few(missing)}, unexpected {_few(extra)})"
    for k, t in have.items():
        if theirs[k][1] != t[1]:
            return f"{k!r} has dtype {theirs[k][1][:32]}, expected {t[1]}"
        if theirs[k][2] != list(t[2]):
            return f"{k!r} has shape {tuple(theirs[k][2][:8])}, expected {tuple(t[2])}"
    return "tensors listed in a different order than the global model's"


def _show(value: Any, n: int = 40) -> str:
    """repr of a value a peer sent, cut to `n` characters."""
    r = repr(value)
    return r if len(r) <= n else r[: n - 3] + "..."


def _few(names: list[str], n: int = 5) -> str:
    """At most `n` names, each cut to 64 characters: a peer's names never make a long line."""
    shown = [x[:64] for x in names[:n]]
    return repr(shown) if len(names) <= n else f"{shown!r} and {len(names) - n} more"
