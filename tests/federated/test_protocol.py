"""The typed federated protocol (one encoder, one decoder, a family per receiving role) and a combiner's round as pure
state (accept, refuse, fold, report), driven with messages the test builds itself: no sockets."""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass

import numpy as np
import pytest

from nebula.federated.combiner.round_state import RoundState
from nebula.federated.messages import (TO_CLIENT, TO_COMBINER, TO_CONTROLLER, ClientUpdate, Partial, StartRound,
                                       Stop)
from nebula.federated.strategy import get_strategy
from nebula.messaging import (Malformed, Message, MessageFamily, ModelLayout, Peer, ProtocolError, decode, encode,
                              manifest, to_json)
from nebula.messaging.protocol import decode_parts, encode_parts, local_field, raw_field

W = {"w": np.zeros((2, 3), np.float32), "b": np.zeros(3, np.float32)}


def test_every_message_round_trips_through_json_and_the_wire_form_is_flat():
    layout = ModelLayout(tensors=manifest(W), piece_bytes=4096, inline=True, frames=(2, 1))
    msg = StartRound(run="0.ab", to="n1", round=3, version=7, deadline_s=30.0, clients=("A/2", "B/2"),
                     config={"proximal_mu": 0.1}, copies=1, model=layout)
    wire = json.loads(json.dumps(encode(msg)))
    assert wire["type"] == "round" and wire["clients"] == ["A/2", "B/2"] and wire["tensors"] == manifest(W)
    assert wire["inline"] is True and wire["frames"] == [2, 1] and "model" not in wire
    assert decode(wire, TO_COMBINER) == msg
    stop = Stop(run="0.ab", to="n1")
    assert decode(encode(stop), TO_COMBINER) == stop and decode(encode(stop), TO_CLIENT) == stop


@pytest.mark.parametrize("head,family,needle", [
    ({"type": "partial"}, TO_COMBINER, "unknown combiner message type 'partial'; known types: async"),
    ({"type": "round", "run": "r", "to": "n", "round": 1, "version": 1, "deadline_s": 1, "clients": []},
     TO_CONTROLLER, "unknown controller message type 'round'"),
    ({"type": "task", "round": "3", "version": 1, "deadline_s": 1}, TO_CLIENT, "task.round: expected int, got '3'"),
    ({"type": "task", "round": True, "version": 1, "deadline_s": 1}, TO_CLIENT, "task.round: expected int, got True"),
    ({"type": "task", "version": 1, "deadline_s": 1}, TO_CLIENT, "task: required field round missing"),
    ({"type": "stop", "to": "n", "rm": "-rf"}, TO_CLIENT, "stop: unknown field 'rm'"),
    ({"type": "partial", "round": 1, "version": 1, "num_updates": 1, "num_examples": 1, "clients": ["A/2", 5]},
     TO_CONTROLLER, "partial.clients[1]: expected str, got 5"),
    ({"version": 1}, TO_CLIENT, "message without a type"),
    ([1, 2], TO_CLIENT, "must be a JSON object"),
])
def test_a_header_that_does_not_decode_is_named_with_its_field(head, family, needle):
    with pytest.raises(ProtocolError, match=needle.replace("[", r"\[").replace("]", r"\]").replace("(", r"\(")):
        decode(head, family)


def test_a_new_family_slots_in_beside_the_others():
    secure = MessageFamily("secure-sum")

    @secure.message("masked")
    class Masked(Message):
        round: int
        public_key: bytes
        shares: tuple[int, ...] = ()

    msg = Masked(round=2, public_key=b"\x00\xffkey", shares=(1, 2))
    wire = json.loads(json.dumps(encode(msg)))
    assert wire["public_key"] == "AP9rZXk=" and decode(wire, secure) == msg
    with pytest.raises(ProtocolError, match="masked.public_key: expected base64 bytes"):
        decode({**wire, "public_key": "not base64!"}, secure)
    with pytest.raises(ProtocolError, match="unknown combiner message type 'masked'"):
        decode(encode(msg), TO_COMBINER)
    with pytest.raises(ValueError, match="registered twice"):
        secure.message("masked")(Masked)


NESTED = MessageFamily("nested")


@dataclass(frozen=True, slots=True)
class _Sealed:
    """A nested dataclass with a raw field between two that travel in the header."""

    owner: str
    blob: bytes = raw_field()
    tag: bytes = b""


@NESTED.message("bundle")
@dataclass(frozen=True, slots=True)
class _Bundle(Message):
    round: int
    items: tuple[_Sealed, ...]
    extra: bytes = raw_field(default=b"")
    words: object = local_field()
    to: str | None = None


def test_nested_dataclasses_raw_and_local_fields_round_trip_through_one_header_and_one_raw_part():
    msg = _Bundle(7, (_Sealed("a", b"\x01" * 5, b"t"), _Sealed("b", b"", b"")), extra=b"xyz", words=[1, 2], to="n")
    parts = encode_parts(msg)
    head = json.loads(parts[0])
    assert head == {"type": "bundle", "round": 7, "items": [{"owner": "a", "blob": 5, "tag": "dA=="},
                                                            {"owner": "b", "blob": 0, "tag": ""}],
                    "extra": 3, "to": "n"}  # raw fields as their lengths, the local one not at all
    assert parts[1] == b"\x01" * 5 + b"xyz" and len(parts) == 2
    got, rest = decode_parts(head, NESTED, [parts[1], b"payload"])
    assert got == dataclasses.replace(msg, words=None) and rest == [b"payload"]  # the parts after the raw one
    assert encode(msg) == head and to_json(msg) == parts[0]  # (the header alone)
    empty = _Bundle(1, ())
    assert encode_parts(empty) == [to_json(empty)]  # no raw bytes: no raw part
    assert decode_parts(encode(empty), NESTED, [b"piece"]) == (empty, [b"piece"])


@pytest.mark.parametrize("change,parts,needle", [
    (lambda h: h["items"][0].update(owner=3), None, "bundle.items[0].owner: expected str, got 3"),
    (lambda h: h["items"][0].update(rm=1), None, "bundle.items[0]: unknown field 'rm'"),
    (lambda h: h["items"][0].pop("owner"), None, "bundle.items[0]: required field owner missing"),
    (lambda h: h.update(items=[5]), None, "bundle.items[0]: expected an object (_Sealed), got 5"),
    (lambda h: h["items"][0].update(blob=-1), None, "bundle.items[0].blob: expected a raw field's length, got -1"),
    (lambda h: h["items"][0].update(blob=True), None, "expected a raw field's length, got True"),
    (lambda h: h.update(words=[1]), None, "bundle: unknown field 'words'"),  # a local field never travels
    (lambda h: None, [], "bundle.items[0].blob: 5 raw bytes announced, but no raw part follows the header"),
    (lambda h: None, [b"\x01" * 7], "bundle.extra: 3 raw bytes announced at offset 5, the raw part holds 7"),
    (lambda h: None, [b"\x01" * 9], "bundle: a raw part of 9 bytes, its fields announce 8"),
])
def test_a_nested_object_or_a_raw_part_that_does_not_match_its_header_is_refused_by_name(change, parts, needle):
    msg = _Bundle(7, (_Sealed("a", b"\x01" * 5),), extra=b"xyz")
    wire = encode_parts(msg)
    head = json.loads(wire[0])
    change(head)
    with pytest.raises(ProtocolError, match=needle.replace("[", r"\[").replace("]", r"\]").replace("(", r"\(")
                       .replace(")", r"\)")) as e:
        decode_parts(head, NESTED, wire[1:] if parts is None else parts)
    assert e.value.type == "bundle" and "\n" not in str(e.value)


def test_a_malformed_message_names_the_process_its_header_addressed_if_any():
    """So a receiver that takes only what is addressed to it (a client's `for_me`) still hears of one meant for it."""
    assert Malformed(claimed="sa_roster", reason="r", head={"to": "n1"}).to == "n1"
    assert Malformed(claimed=None, reason="r", head={"to": 5}).to is None
    assert Malformed(claimed=None, reason="r", head={}).to is None


def test_a_family_includes_another_s_types_once():
    inbox = MessageFamily("inbox")
    inbox.include(NESTED)
    assert decode_parts(encode(_Bundle(1, ())), inbox)[0] == _Bundle(1, ())
    with pytest.raises(ValueError, match="registered twice"):
        inbox.include(NESTED)


def _round(strategy: str = "fedavg") -> RoundState:
    return RoundState(job="j", round=5, version=7, asked=[Peer("A", 2), Peer("B", 2)], weights=W,
                      strategy=get_strategy(strategy), max_examples=100)


def _update(**over) -> ClientUpdate:
    fields = {"job": "j", "round": 5, "version": 7, "num_examples": 10, "metrics": {"accuracy": 0.5,
                                                                                    "eval_examples": 4}}
    return ClientUpdate(**{**fields, **over}, model=ModelLayout(tensors=manifest(W), piece_bytes=4096))


def _pieces(value: float):
    return [(k, 0, np.full(v.size, value, np.float32)) for k, v in W.items()]


def test_a_round_accepts_refuses_and_folds_without_any_io():
    st = _round()
    assert st.waiting() and [str(p) for p in st.missing()] == ["A/2", "B/2"]
    # a late update is counted (a sender may repeat it at will), not recorded as A/2's answer
    late = _update(round=4, version=6)
    why = st.check("A/2", late, known_version=7)
    assert why.kind == "late" and st.refuse("A/2", late, why) is False and st.waiting()
    # an asked client's bad answer for this round is its answer, recorded one by one
    bad = _update(num_examples=10**9)
    why = st.check("A/2", bad, known_version=7)
    assert why.kind == "examples" and st.refuse("A/2", bad, why) is True
    assert st.rejected == [{"client": "A/2", "reason": str(why)}]
    good = _update(num_examples=30)
    assert st.check("B/2", good, known_version=7) is None
    st.accept("B/2")
    assert st.check("B/2", good, known_version=7).kind == "duplicate"
    st.fold("B/2", good, _pieces(2.0), nbytes=36, norm=1.5)
    assert not st.waiting()
    partial, weights = st.partial(run="0.ab", counted=[{"client": "2 from A/9", "reason": "late"}], checkpoint=None,
                                  delta=False)
    assert isinstance(partial, Partial) and partial.num_updates == 1 and partial.num_examples == 30
    assert partial.clients == ("B/2",) and partial.update_bytes == 36 and partial.update_norm_max == 1.5
    assert partial.rejected[-1]["client"] == "2 from A/9" and partial.metrics == {"accuracy": 0.5}
    np.testing.assert_array_equal(weights["w"], np.full((2, 3), 2.0, np.float32))
    assert decode(json.loads(json.dumps(encode(partial))), TO_CONTROLLER) == partial


def test_a_malformed_update_and_a_refused_grant_are_refusals_of_their_own_kind():
    st = _round()
    broken = Malformed(claimed="update", reason="A/2: update: unknown field 'x'", head={"type": "update", "round": 5})
    why = st.check("A/2", broken, known_version=7)
    assert why.kind == "malformed" and "unknown field 'x'" in str(why) and st.refuse("A/2", broken, why) is True
    assert st.check("B/2", _update(), known_version=7, grant="no job grant").kind == "grant"


def test_a_non_streaming_strategy_keeps_each_update_and_combines_at_the_end():
    st = _round("median")
    for who, value in (("A/2", 1.0), ("B/2", 3.0)):
        st.accept(who)
        st.fold(who, _update(), _pieces(value), nbytes=0, norm=None)
    partial, weights = st.partial(run=None, counted=[], checkpoint=None, delta=False)
    assert partial.num_updates == 2 and partial.num_examples == 20
    np.testing.assert_allclose(weights["b"], 2.0)


def test_an_update_that_fails_while_its_pieces_come_is_taken_out_of_the_accepted():
    st = _round()
    st.accept("A/2")
    st.reject("A/2", "incomplete update: pieces stopped")
    partial, weights = st.partial(run=None, counted=[], checkpoint=None, delta=False)
    assert partial.clients == () and weights is None
    assert partial.rejected == ({"client": "A/2", "reason": "incomplete update: pieces stopped"},)


def test_the_controllers_reduce_is_pure_state_too():
    from nebula.federated.config import ValiditySpec
    from nebula.federated.controller.reduction import Reduction

    red = Reduction(W, coded=False, update_codec="none", validity=ValiditySpec(min_updates=3),
                    expected_examples=40)
    assert "is a change, the job's update_codec='none' makes it weights" in red.refusal(
        Partial(round=1, version=1, num_updates=1, num_examples=10, delta=True), asked=1)
    for n, value, metrics in ((10, 1.0, {"accuracy": 0.5}), (30, 3.0, {"accuracy": 1.0})):
        p = Partial(round=1, version=1, num_updates=1, num_examples=n, clients=(f"A/{n}",), metrics=metrics,
                    eval_examples=n)
        assert red.refusal(p, asked=1) is None
        red.begin(p, "combiner A/1")
        for k, off, v in _pieces(value):
            red.mean.add_part(k, v, off)
        red.take(p)
    red.lose("B/1", clients=["B/2"])
    assert red.invalid() == "2 updates < validity.min_updates=3" and red.missing == ["B/2"] and red.lost == ["B/1"]
    np.testing.assert_allclose(red.result()["b"], 2.5)  # (10 x 1 + 30 x 3) / 40
    assert red.metrics() == {"parent_accuracy": pytest.approx(0.875)}
    red.lose("C/1", broken=True)
    assert red.invalid() == "a partial model broke off mid-transfer"


def test_the_federated_actors_and_their_job_file_load_without_paddle():
    """A combiner or a controller holds no Paddle (its resident size was 5x larger when the job file's owl: section
    pulled OWL's model code in)."""
    import subprocess
    import sys

    code = ("import sys, nebula.federated.run, nebula.federated.config, nebula.cli.fl; "
            "print(sorted(m for m in sys.modules if m == 'paddle' or m.startswith('paddle.'))[:3])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stdout + out.stderr[-2000:]
