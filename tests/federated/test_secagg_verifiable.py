"""Hostile clients in a SecAgg+ round, against the pure state machines (a combiner with a certificate verifier):
a dealer of a bad share is found by the share check, left out before any masked input and blamed, while the honest
clients' round closes with their exact sum; a false complaint blames the complainer; an unsettled one voids one
share and blames nobody; a wrong share at the reveal blames its sender, never its owner; out-of-range words make
the round invalid with the reason recorded; a weight above max_weight is refused even when signed; and a job file
with secure aggregation but no per-client signers is refused in one line."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import yaml

from nebula.federated.secagg import (Complaint, SecAggConfig, SecAggRefused, SecAggServer, ShareCheck,
                                     crypto, shamir)
from nebula.federated.secagg.client import share_aad, share_info, weight_statement
from tests.federated.test_secagg import make_clients, run_round, seeded, updates, verifier, weighted_reference

W = 1000


def _round(n=7, d=64, seed=1, **cfg):
    names, xs, ns = updates(n, d, seed=seed)
    params = SecAggConfig(max_weight=W, **cfg).round_params(1, names, d, bytes([seed]) * 16)
    return names, xs, ns, params


def _round_state(names, d: int = 16):
    """A combiner's secure round of job "j", round 1, over `names`, on a zero model of `d` values."""
    from nebula.federated import get_strategy
    from nebula.federated.combiner.secure_state import SecureRoundState
    from nebula.messaging import Peer

    return SecureRoundState(config=SecAggConfig(max_weight=W), word_bits=32, claimed={c: 200 for c in names},
                            verifier=verifier(), job="j", round=1, version=0, asked=[Peer.parse(c) for c in names],
                            weights={"w": np.zeros(d, np.float32)}, strategy=get_strategy("fedavg", {}),
                            max_examples=10**6)


def _reason(e: pytest.ExceptionInfo) -> str:
    assert "\n" not in str(e.value)
    return str(e.value)


def _tamper_one(stage: str, who: str, change):
    """A tamper for run_round: `change(msg)` replaces `who`'s message of `stage`; every other message passes."""
    return lambda st, c, msg: change(msg) if st == stage and c == who else msg


def _verified_round(params, xs, ns, cl, tamper):
    """run_round with a combiner that checks certificates, and one tamper."""
    return run_round(params, xs, ns, clients=cl, server=SecAggServer(params, verifier()), tamper=tamper)


def _bad_share(cl, params, dealer: str, victim: str):
    """A tamper for run_round: `dealer` seals `victim` a share off its committed polynomials, under the true key
    (so its key check holds and the server can prove it)."""
    def tamper(stage, c, msg):
        if stage != "shares" or c != dealer:
            return msg
        sa = cl[dealer]
        key = crypto.agree(sa._cipher_sk, sa._roster[victim].cipher_pk, share_info(sa.tag, dealer, victim))
        plain = shamir.SHARE_BYTES * b"\1" + shamir.SHARE_BYTES * b"\2"
        bad = crypto.seal(key, plain, share_aad(sa.tag, dealer, victim))
        return dataclasses.replace(msg, shares=tuple(dataclasses.replace(e, ciphertext=bad) if e.receiver == victim
                                                     else e for e in msg.shares))
    return tamper


def test_a_bad_dealer_is_found_left_out_before_masking_and_blamed_while_the_honest_sum_is_exact():
    names, xs, ns, params = _round()
    cl = make_clients(params, seeded(2))
    dealer, victim = names[3], names[0]
    srv = SecAggServer(params, verifier())
    srv, cl, masked = run_round(params, xs, ns, clients=cl, server=srv, tamper=_bad_share(cl, params, dealer, victim))
    s = srv.result()
    honest = [c for c in names if c != dealer]
    assert s.survivors == tuple(honest) and s.dropped == () and dealer not in masked  # out before it could mask
    assert np.abs(s.vector - weighted_reference(honest, xs, ns, W, 1.0)).max() <= s.error_bound
    assert s.num_examples == sum(min(ns[c], W) for c in honest)
    assert set(srv.blamed) == {dealer} and f"dealt {victim!r} a bad share" in srv.blamed[dealer]
    assert "self-mask seed share is not on the dealer's committed polynomial" in srv.blamed[dealer]
    assert srv.excluded[dealer] == srv.blamed[dealer] and not srv.disputes  # the victim is never blamed
    assert dealer not in cl[victim]._held and all(dealer not in cl[c]._partners for c in honest)


def test_a_false_complaint_blames_the_complainer_not_the_dealer():
    names, xs, ns, params = _round(seed=3)
    cl = make_clients(params, seeded(4))
    liar, dealer = names[1], names[5]

    def complain(msg):  # with the true key of a share that opens and verifies
        sa = cl[liar]
        key = crypto.agree(sa._cipher_sk, sa._roster[dealer].cipher_pk, share_info(sa.tag, dealer, liar))
        return ShareCheck(liar, msg.round, (Complaint(dealer, key),))

    srv, _, _ = _verified_round(params, xs, ns, cl, _tamper_one("check", liar, complain))
    s = srv.result()
    assert set(srv.blamed) == {liar} and f"complained falsely about the share of {dealer!r}" in srv.blamed[liar]
    assert dealer in s.survivors and liar not in s.survivors + s.dropped
    honest = [c for c in names if c != liar]
    assert np.abs(s.vector - weighted_reference(honest, xs, ns, W, 1.0)).max() <= s.error_bound


def test_an_unsettled_complaint_voids_one_share_and_blames_nobody():
    """The dealer seals a bad share and says it used another key (its key check): the receiver complains with the
    true key, which the server cannot tell from a lie; that one share is held by nobody, nobody is blamed, both stay
    in, and the round still closes."""
    names, xs, ns, params = _round(seed=5)
    cl = make_clients(params, seeded(6))
    who, dealer = names[2], names[4]

    tamper = _tamper_one("shares", dealer, lambda msg: dataclasses.replace(msg, shares=tuple(
        dataclasses.replace(e, ciphertext=bytes(len(e.ciphertext)), key_check=bytes(32)) if e.receiver == who
        else e for e in msg.shares)))
    srv, _, _ = _verified_round(params, xs, ns, cl, tamper)
    s = srv.result()
    assert not srv.blamed and srv.void == {(dealer, who)} and len(srv.disputes) == 1
    assert "unsettled" in srv.disputes[0] and s.survivors == tuple(sorted(names))
    assert dealer not in cl[who]._held and dealer in cl[who]._partners  # no share held, masks still shared
    assert np.abs(s.vector - weighted_reference(names, xs, ns, W, 1.0)).max() <= s.error_bound


def test_a_wrong_share_at_the_reveal_blames_its_sender_never_the_owner():
    names, xs, ns, params = _round(seed=7)
    cl = make_clients(params, seeded(8))
    sender, owner = names[2], names[0]

    tamper = _tamper_one("reveal", sender, lambda msg: dataclasses.replace(msg, seed_shares=tuple(
        (o, bytes(shamir.SHARE_BYTES - 1) + b"\7" if o == owner else s) for o, s in msg.seed_shares)))
    srv, _, _ = _verified_round(params, xs, ns, cl, tamper)
    assert params.point(sender) <= params.threshold  # its share is among the t used first: the secret fails
    s = srv.result()
    assert set(srv.blamed) == {sender} and f"self-mask seed of {owner!r}" in srv.blamed[sender]
    assert owner in s.survivors  # the victim's input still counts, its seed rebuilt from t good shares
    assert np.abs(s.vector - weighted_reference(names, xs, ns, W, 1.0)).max() <= s.error_bound


def test_out_of_range_words_make_the_round_invalid_with_the_reason_recorded():
    names, xs, ns, params = _round(n=5, d=16, seed=9)
    st = _round_state(names)
    cl = make_clients(st.params, seeded(10))
    bound = st.params.quantizer.sum_bound([min(ns[c], W) for c in names])

    def tamper(stage, c, msg):  # one client pushes every word of its input past what all five could sum to
        if stage == "masked" and c == names[1]:
            return dataclasses.replace(msg, words=msg.words + np.array(2 * bound + 1, np.uint32))
        return msg

    run_round(st.params, {c: xs[c][:16] for c in names}, ns, clients=cl, server=st.server, tamper=tamper)
    partial, model = st.partial(run=None, counted=[], checkpoint=None, delta=True)
    assert model is None and partial.num_updates == 0 and st.abandoned is not None
    (why,) = [r["reason"] for r in partial.rejected if r["client"] == "5 clients"]
    assert "16 of 16 coordinates lie outside" in why and "out-of-range words" in why and "\n" not in why


def test_a_weight_above_max_weight_is_refused_even_signed_by_its_client():
    names, xs, ns, params = _round(n=5, seed=11)
    cl = make_clients(params, seeded(12))
    heavy = names[0]

    def tamper(stage, c, msg):
        if stage == "masked" and c == heavy:
            sa = cl[c]
            return dataclasses.replace(msg, weight=W + 1, signature=sa.signer.sign(weight_statement(sa.tag, c, W + 1)))
        return msg

    with pytest.raises(SecAggRefused) as e:
        run_round(params, xs, ns, clients=cl, server=SecAggServer(params, verifier()), tamper=tamper)
    assert f"integer in [1, {W}]; got {W + 1}" in _reason(e) and repr(heavy) in _reason(e)
    # a weight within the cap but signed by nobody, or for another weight, is refused too
    srv, fresh = SecAggServer(params, verifier()), make_clients(params, seeded(13))
    for c in names:
        srv.receive_keys(fresh[c].advertise())
    sign = fresh[heavy].signer.sign
    with pytest.raises(SecAggRefused, match="its weight is not signed by its certificate"):
        srv.check_weight(heavy, 7, sign(weight_statement(srv.tag, heavy, 8)))
    with pytest.raises(SecAggRefused, match="its weight is not signed by its certificate"):  # another's signature
        srv.check_weight(heavy, 8, fresh[names[1]].signer.sign(weight_statement(srv.tag, heavy, 8)))
    assert srv.check_weight(heavy, 8, sign(weight_statement(srv.tag, heavy, 8))) == 8


def test_a_secure_job_without_per_client_signers_is_refused_in_one_line(tmp_path):
    from nebula.config.schema import ConfigError
    from nebula.federated.config import load_federated_job

    doc = {"job": "j", "mode": "federated", "controller": {"cluster": "A"},
           "clusters": [{"id": "A", "worker": "w.yaml", "num_clients": 3}], "client": {"factory": "m:f"},
           "secure_aggregation": {"protocol": "secagg+"}}
    f = tmp_path / "job.yaml"
    f.write_text(yaml.safe_dump(doc))
    with pytest.raises(ConfigError) as e:
        load_federated_job(f)
    msg = str(e.value)
    assert "\n" not in msg and "secure_aggregation.signers is empty" in msg and "job.yaml" in msg
    assert "nebula-admin cert issue --ca CA --role worker --cluster C --name client-<index> --out DIR" in msg
    doc["secure_aggregation"]["signers"] = "signers/client-{index}"
    f.write_text(yaml.safe_dump(doc))
    assert load_federated_job(f).secure_aggregation.signers == "signers/client-{index}"


def test_the_reducer_takes_a_secure_partial_s_weight_only_within_its_clients_public_weights():
    from nebula.federated.config import ValiditySpec
    from nebula.federated.controller.reduction import Reduction
    from nebula.federated.messages import Partial

    red = Reduction({"w": np.zeros(3, np.float32)}, coded=True, update_codec="none", validity=ValiditySpec(),
                    expected_examples=0, max_weight=W)
    ok = Partial(run="r", round=1, version=1, num_updates=3, num_examples=600, delta=True, weight=3 * W)
    assert red.refusal(ok, asked=3) is None
    for w in (2, 3 * W + 1, 2 ** 32 - 1, None, True):  # a combiner cannot silence the others with its weight
        why = red.refusal(dataclasses.replace(ok, weight=w), asked=3)
        assert why is not None and f"outside [3, {3 * W}]" in why and "max_weight=1000" in why and "\n" not in why


def test_commitments_travel_raw_after_the_delivery_header_and_a_client_takes_them_only_whole_and_signed():
    """Through the combiner's state and the wire: the delivery's header carries the shares and each dealer's
    signature, its one raw part the commitments (not base64 in the header); the client checks every share against
    them, and refuses a part cut short or too long, none, commitments of the wrong size, or two dealers'
    commitments swapped (their signatures do not hold)."""
    import json

    from nebula.federated.messages import TO_CLIENT
    from nebula.federated.secagg import ShareDelivery, vss
    from nebula.messaging import ProtocolError
    from nebula.messaging.protocol import decode_parts, encode_parts

    names, _, _, _ = _round(n=5, d=16, seed=3)
    st = _round_state(names)
    cl = make_clients(st.params, seeded(4))
    for c in names:
        assert st.take(c, cl[c].advertise()) is None
    for c, r in st.close_keys().items():
        assert st.take(c, cl[c].share_keys(r)) is None
    each = st.params.threshold * vss.ELEMENT_BYTES
    for i, (c, delivery) in enumerate(sorted(st.close_shares().items())):
        wire, raw = encode_parts(delivery)
        head = json.loads(wire)
        assert len(raw) == 2 * each * len(delivery.commitments) and len(wire) < len(raw) / 2  # the bulk is raw
        assert [x["seed"] for x in head["commitments"]] == [each] * len(delivery.commitments)
        msg, rest = decode_parts(head, TO_CLIENT, [memoryview(raw)])
        assert isinstance(msg, ShareDelivery) and msg == delivery and rest is None
        if i == 0:  # a part cut short or too long, or none: refused before any share is opened
            for parts, needle in (([raw[:-1]], "the raw part holds"), (None, "no raw part follows the header"),
                                  ([raw + b"x"], f"a raw part of {len(raw) + 1} bytes, its fields announce")):
                with pytest.raises(ProtocolError, match=needle):
                    decode_parts(head, TO_CLIENT, parts)
            # commitments cut to another size, the header's lengths to match: the client refuses the delivery
            short = dataclasses.replace(msg, commitments=tuple(dataclasses.replace(x, seed=x.seed[:-1])
                                                               for x in msg.commitments))
            with pytest.raises(SecAggRefused, match="the combiner relays malformed deliveries"):
                cl[c].check_shares(decode_parts(json.loads(encode_parts(short)[0]), TO_CLIENT,
                                                encode_parts(short)[1:])[0])
        if i == 1:  # the first two dealers' commitments swapped: each signature covers its own dealer's bytes
            swapped = raw[2 * each:4 * each] + raw[:2 * each] + raw[4 * each:]
            with pytest.raises(SecAggRefused, match="not signed by its certificate"):
                cl[c].check_shares(decode_parts(head, TO_CLIENT, [memoryview(swapped)])[0])
            continue
        assert cl[c].check_shares(msg).complaints == ()


def test_a_stage_message_naming_another_client_than_its_channel_is_refused_and_the_named_client_keeps_its_place():
    """A client's stage messages name it; the combiner takes the sender from the channel, so a client that sends
    another's keys (or a masked input in another's name) is refused with one line, and the named client's own
    message is still taken."""
    from nebula.messaging import ModelLayout

    names, _, _, _ = _round(n=5, d=16, seed=5)
    st = _round_state(names)
    cl = make_clients(st.params, seeded(6))
    thief, victim = names[0], names[1]
    keys = cl[victim].advertise()
    why = st.take(thief, keys)
    assert why is not None and why.kind == "secagg" and "\n" not in str(why)
    assert f"sa_keys names client {victim!r} but came from {thief!r}" in str(why)
    assert victim not in st.server.keys
    assert st.take(victim, keys) is None and victim in st.server.keys
    from nebula.federated.secagg import MaskedInput

    masked = MaskedInput(victim, 1, None, 1, b"s", job="j", model=ModelLayout(tensors=st.masked_spec, piece_bytes=4096))
    why = st.check_masked(names[2], masked, job="j")
    assert why is not None and f"sa_masked names client {victim!r} but came from {names[2]!r}" in str(why)


def test_the_reducer_takes_a_partial_of_no_more_updates_than_its_combiner_was_asked_clients():
    from nebula.federated.config import ValiditySpec
    from nebula.federated.controller.reduction import Reduction
    from nebula.federated.messages import Partial

    red = Reduction({"w": np.zeros(3, np.float32)}, coded=True, update_codec="none", validity=ValiditySpec(),
                    expected_examples=0, max_weight=W)
    ok = Partial(run="r", round=1, version=1, num_updates=3, num_examples=600, delta=True, weight=3 * W)
    assert red.refusal(ok, asked=3) is None
    for n in (4, 2 ** 31, -1, True):  # more than it asked could not have been folded: its count and weight lie
        why = red.refusal(dataclasses.replace(ok, num_updates=n, weight=3 * W), asked=3)
        assert why is not None and "its combiner was asked 3 clients" in why
