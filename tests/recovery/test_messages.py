"""The recovery messages' one encoder and decoder: a round trip, and every malformed field refused with one line."""
from __future__ import annotations

import json

import pytest

from nebula.recovery.messages import (MAX_BYTES, MAX_STEPS, Decided, Holdings, Incarnation, RecoveryRefused, Round,
                                      decode_recovery, encode_recovery)

ABC = ("A", "B", "C")
ROUND = Round(3, (Incarnation(2, 77), Incarnation(1, 5), Incarnation(0, 0)))


@pytest.mark.parametrize("msg", [Holdings("j", "B", ROUND, (10, 20)), Holdings("j", "B", ROUND, ()),
                                 Decided("j", "B", ROUND, 20), Decided("j", "B", ROUND, -1)])
def test_round_trip(msg):
    assert decode_recovery(encode_recovery(msg, ABC), job="j", clusters=ABC, sender="B") == msg


def _doc(**change) -> bytes:
    doc = json.loads(encode_recovery(Holdings("j", "B", ROUND, (10, 20)), ABC))
    doc.update(change)
    return json.dumps({k: v for k, v in doc.items() if v is not ...}).encode()


@pytest.mark.parametrize("data, sender, message", [
    (_doc(job="other"), "B", "is for job 'other', this is 'j'"),
    (_doc(sender="A"), "B", "from cluster B names sender 'A'"),
    (_doc(), "D", "from cluster 'D', which is not one of"),
    (_doc(type="vote"), "B", "no known type"),
    (_doc(extra=1), "B", "keys ['extra'] are unexpected"),
    (_doc(steps=...), "B", "keys ['steps'] are unexpected or missing"),
    (_doc(steps=[20, 10]), "B", "strictly ascending"),
    (_doc(steps=[10, 10]), "B", "strictly ascending"),
    (_doc(steps=[True]), "B", "holdings step must be an integer"),
    (_doc(steps=[-5]), "B", "holdings step must be an integer in [0"),
    (_doc(steps=list(range(MAX_STEPS + 1))), "B", f"at most {MAX_STEPS}"),
    (_doc(steps="10"), "B", "steps must be a list"),
    (_doc(epoch=-1), "B", "epoch must be an integer"),
    (_doc(epoch=1.5), "B", "epoch must be an integer"),
    (_doc(view=[[1, 1]]), "B", "view must be 3 [count, nonce] pairs"),
    (_doc(view=[[1, 1], [0, 0], [1, 1]]), "B", "does not name its own incarnation"),
    (_doc(view=[[1, 1], [1, -2], [1, 1]]), "B", "incarnation nonce must be an integer"),
    (b"\xff not json", "B", "is not JSON"),
    (b"[1, 2]", "B", "no known type"),
    (b" " * (MAX_BYTES + 1), "B", f"at most {MAX_BYTES}"),
])
def test_malformed_messages_are_refused_naming_the_field(data, sender, message):
    with pytest.raises(RecoveryRefused) as err:
        decode_recovery(data, job="j", clusters=ABC, sender=sender)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_decided_step_below_minus_one_is_refused():
    doc = json.loads(encode_recovery(Decided("j", "B", ROUND, 5), ABC))
    doc["step"] = -2
    with pytest.raises(RecoveryRefused, match=r"decided step must be an integer in \[-1"):
        decode_recovery(json.dumps(doc).encode(), job="j", clusters=ABC, sender="B")


def test_rounds_merge_by_epoch_and_newest_incarnation_and_order_launches():
    a = Round(1, (Incarnation(1, 9), Incarnation(2, 1)))
    b = Round(4, (Incarnation(2, 3), Incarnation(1, 8)))
    assert a.merge(b) == Round(4, (Incarnation(2, 3), Incarnation(2, 1)))
    assert Incarnation(2, 1) > Incarnation(1, 99) and Incarnation(2, 5) > Incarnation(2, 4)
