"""Payloads sent once for many frames (`nebula.wire.share`) against real switches: a worker that asked for slots
sends one model to many ranks and its switch receives its bytes once; a connection that breaks its grant is ended,
audited, and the switch serves the rest."""
from __future__ import annotations

import numpy as np
import pytest

from nebula.channel import Endpoint
from nebula.config import load_switch_config
from nebula.wire import FrameType, encode_frame
from nebula.wire.share import PUT, SHARE_TAG, USE, pack_ask, pack_op, read_grant
from nebula.wire.stream import AUTH, AUTH_OK
from testbed.federation import slot_bytes, wait_audit, wait_until
from tests.switch.conftest import TEST_CHUNK_BYTES, exchange, worker_yaml, worker_yaml_as
from tests.switch.test_stream_workers import _credentials, _raw, _read, _send


@pytest.mark.parametrize("transport", ["tls", "unix"])
def test_a_model_sent_to_many_ranks_reaches_the_switch_once(two_switches, tmp_path, transport):
    """A worker with slots sends two models, each to four ranks of its own cluster and one of the other, piece by
    piece as a combiner does: every rank gets each model's exact bytes, and the switch received each piece once
    (the bytes put into slots are one copy of each model; the other copies came from the slots)."""
    fed, _a, b = two_switches
    sender = worker_yaml_as(fed, "B", tmp_path / "s.yaml", transport=transport)
    rng = np.random.default_rng(0)
    models = [[rng.standard_normal(n).astype(np.float32) for n in (300_000, 70_000, 20_000)] for _ in range(2)]
    dests = [("B", r) for r in (1, 2, 3, 4)] + [("A", 1)]
    with Endpoint.connect(sender, job="j", rank=0, share_slots=8) as ep:
        assert ep._io.sock.share is not None and ep._io.sock.share.slots == 8
        receivers = {d: Endpoint.connect(worker_yaml(fed, d[0]), job="j", rank=d[1]) for d in dests}
        try:
            for m, model in enumerate(models):
                token = object()  # (one per model: the bytes a key names never change)
                for i, piece in enumerate(model):
                    for d in dests:
                        ep.channel(*d, "model").send(memoryview(piece).cast("B"), lane="bulk", share=(token, i))
            for d, rx in receivers.items():
                for model in models:
                    for piece in model:
                        assert rx.channel("B", 0, "model").recv(timeout_s=30) == piece.tobytes()
        finally:
            for rx in receivers.values():
                rx.close()
    big = sum(p.nbytes for model in models for p in model if p.nbytes >= 64 * 1024)
    got = slot_bytes(b.config, used=(len(dests) - 1) * big)
    assert got == {"put": big, "used": (len(dests) - 1) * big}


def test_without_slots_the_same_sends_go_whole(two_switches, tmp_path):
    """A worker that asks for no slots (or a switch without room for them) sends `share`d messages as any other:
    they arrive, and the switch counts nothing in slots."""
    fed, _a, b = two_switches
    sender = worker_yaml_as(fed, "B", tmp_path / "s.yaml", transport="tls")
    piece = np.arange(100_000, dtype=np.float32)
    with Endpoint.connect(sender, job="j", rank=0) as ep, \
            Endpoint.connect(worker_yaml(fed, "B"), job="j", rank=1) as rx:
        assert ep._io.sock.share is None
        for _ in range(3):
            ep.channel("B", 1, "m").send(memoryview(piece).cast("B"), lane="bulk", share="model")
        assert [rx.channel("B", 0, "m").recv(timeout_s=30) for _ in range(3)] == [piece.tobytes()] * 3
    assert slot_bytes(b.config, used=0) == {"put": 0, "used": 0}


def _granted(fed, ask: int):
    """A raw stream connection to B that authenticated asking for `ask` slots, and its grant."""
    s = _raw(fed, "B")
    _send(s, [AUTH, *_credentials(fed, "B"), pack_ask(ask)])
    answer = _read(s)
    assert answer is not None and answer[0] == AUTH_OK
    return s, read_grant(answer[2]) if len(answer) == 3 else None


@pytest.mark.parametrize("parts, why", [
    (lambda head: [head, SHARE_TAG, pack_op(USE, 0)], "a USE of slot 0, which holds nothing"),
    (lambda head: [head, SHARE_TAG, pack_op(PUT, 2), b"x" * 70_000], "slot 2 of a connection granted 2 slots"),
    (lambda head: [head, SHARE_TAG, pack_op(PUT, 0), b"x" * (TEST_CHUNK_BYTES + 1)], "into a slot of"),
    (lambda head: [head, SHARE_TAG, b"\x07\x00\x00"], "neither PUT"),
])
def test_a_connection_that_breaks_its_grant_is_ended_audited(two_switches, parts, why):
    """A USE of an empty slot, a slot beyond the grant, a PUT over a slot's bytes or an unknown operation ends the
    connection: the refusal is audited with its reason, and the switch goes on serving other workers."""
    fed, _a, b = two_switches
    s, grant = _granted(fed, 2)
    assert grant == (2, TEST_CHUNK_BYTES)
    head = encode_frame(FrameType.HELLO, {"job": "j", "rank": 5, "account": "nebula", "name": "worker"})
    _send(s, parts(head))
    assert _read(s) is None
    s.close()
    rec = wait_audit(b, lambda r: r["detail"].get("reason") == "bad_share")
    assert rec["action"] == "connection_dropped" and why in rec["detail"]["detail"]
    assert rec["target"] == "worker:worker" and rec["detail"]["transport"] == "unix"
    assert exchange(worker_yaml(fed, "A"), worker_yaml(fed, "B")) == ("unix", "unix")


def test_slots_are_granted_within_the_switchs_budget(two_switches):
    """Connections are granted slots while the switch's budget for them (an eighth of its memory cap) has room;
    a connection's slots return to the budget when it ends."""
    fed, _a, b = two_switches
    cfg = load_switch_config(b.config)
    room = cfg.link.memory_cap_bytes // 8 // cfg.link.chunk_bytes
    first, g1 = _granted(fed, 64)
    assert g1 == (min(64, room), cfg.link.chunk_bytes)
    rest = []
    left = room - g1[0]
    while left > 0:
        s, g = _granted(fed, 64)
        rest.append(s)
        assert g[0] == min(64, left)
        left -= g[0]
    late, none = _granted(fed, 1)
    assert none is None  # (the budget is spent: AUTH_OK grants nothing)
    first.close()

    def regranted():  # the switch sees the connection end and gives its slots back
        s, g = _granted(fed, 64)
        if g is None:
            s.close()
            return None
        return s, g

    again, g2 = wait_until(regranted, 30, "B to give the ended connection's slots back")
    assert g2 == (min(64, g1[0]), cfg.link.chunk_bytes)
    for s in (late, again, *rest):
        s.close()
