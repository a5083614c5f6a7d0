"""SecAgg+ around the protocol: every refusal is one line fit for the audit record, strategies and codecs that do
not compose are refused, sums of sums through the hierarchy equal flat FedAvg, and the graph has its degree."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from nebula.federated import get_strategy
from nebula.federated.aggregate import fedavg
from nebula.mean import RunningMean
from nebula.federated.secagg import (SecAggClient, SecAggConfig, SecAggRefused, SecAggServer, check_codec_precision,
                                     check_strategy, default_degree, flatten, harary_graph, partial_mean,
                                     reduce_sums, unflatten, word_bits_for_codec)
from nebula.federated.secagg.messages import EncryptedShare, MaskedInput, ShareDelivery, SurvivorSet, UnmaskRequest
from tests.federated.test_secagg import make_clients, run_round, seeded, signer_of, updates, verifier


def one_line(exc: pytest.ExceptionInfo, *needles: str) -> None:
    msg = str(exc.value)
    assert "\n" not in msg and msg, msg
    for n in needles:
        assert n in msg, (n, msg)


@pytest.fixture
def staged():
    """A round of 6 stopped after the share check: server, clients, their messages."""
    names, xs, ns = updates(6, 32, seed=1)
    params = SecAggConfig(max_weight=100).round_params(4, names, 32, b"a" * 16)
    srv, cl, rb = SecAggServer(params), {}, seeded(2)
    cl = make_clients(params, rb)
    adv = {c: cl[c].advertise() for c in names}
    for a in adv.values():
        srv.receive_keys(a)
    rosters = srv.rosters()
    shares = {c: cl[c].share_keys(r) for c, r in rosters.items()}
    for s in shares.values():
        srv.receive_shares(s)
    deliveries = srv.deliveries()
    for c, d in deliveries.items():
        srv.receive_check(cl[c].check_shares(d))
    verdicts = srv.verdicts()
    return dict(names=names, xs=xs, ns=ns, params=params, srv=srv, cl=cl, adv=adv, rosters=rosters, shares=shares,
                deliveries=deliveries, verdicts=verdicts)


def test_server_refuses_bad_messages_with_one_line_each(staged):
    s, names, p = staged["srv"], staged["names"], staged["params"]
    with pytest.raises(SecAggRefused) as e:  # a stage that is over
        s.receive_keys(staged["adv"][names[0]])
    one_line(e, "round 4", "advertise message after that stage")
    c0, c1 = (staged["cl"][c] for c in names[:2])
    words = p.quantizer.encode_vector(staged["xs"][names[0]], 3)
    for bad, needle in [(MaskedInput("stranger", 4, words), "'stranger'"),
                        (MaskedInput(names[0], 3, words), "message of round 3"),
                        (MaskedInput(names[0], 4, words.astype(np.uint16)), "32 words of uint32"),
                        (MaskedInput(names[0], 4, words[:-1]), "32 words of uint32"),
                        (MaskedInput(names[0], 4, words, 101, b"x"), r"integer in [1, 100]; got 101"),
                        (MaskedInput(names[0], 4, words, 3, b""), "a weight comes signed")]:
        with pytest.raises(SecAggRefused) as e:
            s.receive_masked(bad)
        one_line(e, needle)
    m0 = c0.mask(staged["verdicts"][names[0]], staged["xs"][names[0]], 3)
    s.receive_masked(m0)
    with pytest.raises(SecAggRefused) as e:
        s.receive_masked(m0)
    one_line(e, "twice", repr(names[0]))
    for c in names[1:]:
        s.receive_masked(staged["cl"][c].mask(staged["verdicts"][c], staged["xs"][c], 3))
    for c, ss in s.survivor_sets().items():
        s.receive_signature(staged["cl"][c].sign_survivors(ss))
    reqs = s.unmask_requests()
    r1 = c1.unmask(reqs[names[1]])
    forged = dataclasses.replace(r1, seed_shares=r1.seed_shares[:-1])
    with pytest.raises(SecAggRefused) as e:
        s.receive_unmask(forged)
    one_line(e, "do not match the clients its request named")


def test_server_refuses_bad_or_repeated_keys_and_strangers():
    names, _, _ = updates(4, 8, seed=1)
    p = SecAggConfig().round_params(2, names, 8, b"k" * 16)
    s = SecAggServer(p)
    good = SecAggClient(names[0], p, signer_of(names[0]), verifier()).advertise()
    for bad, needle in [(dataclasses.replace(good, client="eve"), "not in the round"),
                        (dataclasses.replace(good, signature=b""), "keys must come signed"),
                        (dataclasses.replace(good, chain=bytes(5000)), "keys must come signed"),
                        (dataclasses.replace(good, mask_pk=bytes(32)), "full order"),
                        (dataclasses.replace(good, cipher_pk=good.cipher_pk[:31]), "full order"),
                        (dataclasses.replace(good, mask_pk=good.cipher_pk), "reuses a public key")]:
        with pytest.raises(SecAggRefused) as e:
            s.receive_keys(bad)
        one_line(e, needle, "round 2")
    s.receive_keys(good)
    with pytest.raises(SecAggRefused) as e:
        s.receive_keys(dataclasses.replace(good, client=names[1]))
    one_line(e, "reuses a public key", repr(names[1]))
    with pytest.raises(SecAggRefused) as e:
        s.receive_keys(good)
    one_line(e, "twice")


def test_clients_refuse_what_would_unmask_a_neighbour_or_break_the_round(staged):
    names, p, cl = staged["names"], staged["params"], staged["cl"]
    fresh = make_clients(p, seeded(2))  # the same randomness: clients in the state `staged` left before the check
    for c in names:
        fresh[c].advertise()
        fresh[c].share_keys(staged["rosters"][c])
    c = fresh[names[0]]
    d = staged["deliveries"][names[0]]
    tampered = d.shares[0]
    tampered = dataclasses.replace(tampered, ciphertext=tampered.ciphertext[:-1] + bytes([tampered.ciphertext[-1] ^ 1]))
    sealed_for_other = next(e for e in staged["shares"][names[1]].shares if e.receiver == names[2])
    relabelled = EncryptedShare(names[1], names[0], sealed_for_other.ciphertext)  # sealed for another, relabelled
    for bad in (tampered, relabelled):  # a share that fails is not kept: its dealer is named in a complaint
        rest = tuple(e for e in d.shares if e.sender != bad.sender)
        got = fresh[names[0]].check_shares(ShareDelivery(4, (bad,) + rest, d.commitments))
        assert [x.dealer for x in got.complaints] == [bad.sender] and bad.sender not in fresh[names[0]]._held
        fresh = make_clients(p, seeded(2))
        for x in names:
            fresh[x].advertise()
            fresh[x].share_keys(staged["rosters"][x])
    c = fresh[names[0]]
    with pytest.raises(SecAggRefused) as e:  # commitments that the dealer did not sign: the relay is at fault
        c.check_shares(ShareDelivery(4, d.shares, (dataclasses.replace(d.commitments[0], signature=b"x" * 70),
                                                   *d.commitments[1:])))
    one_line(e, "not signed by its certificate", repr(d.commitments[0].dealer))
    assert c.stage == "check_shares"
    with pytest.raises(SecAggRefused) as e:
        c.check_shares(ShareDelivery(4, d.shares, d.commitments[1:]))
    one_line(e, "missing or not signed")
    assert not c.check_shares(d).complaints
    c = cl[names[0]]
    d = staged["verdicts"][names[0]]
    with pytest.raises(SecAggRefused) as e:
        c.mask(d, np.full(p.vector_length, np.nan), 3)
    one_line(e, "NaN or Inf")
    c.mask(d, staged["xs"][names[0]], 3)
    with pytest.raises(SecAggRefused) as e:
        c.mask(d, staged["xs"][names[0]], 3)
    one_line(e, "out of order")
    with pytest.raises(SecAggRefused) as e:  # asked to reveal before signing the survivor set
        c.unmask(UnmaskRequest(4, tuple(sorted(names)), ()))
    one_line(e, "out of order")
    with pytest.raises(SecAggRefused) as e:
        c.sign_survivors(SurvivorSet(4, tuple(sorted(names[1:]))))
    one_line(e, "leaves this client out")
    with pytest.raises(SecAggRefused) as e:
        c.sign_survivors(SurvivorSet(4, tuple(sorted(names[:2]))))
    one_line(e, "fewer than the threshold")
    with pytest.raises(SecAggRefused) as e:
        c.sign_survivors(SurvivorSet(4, tuple(names[::-1])))
    one_line(e, "not a sorted list")
    c.sign_survivors(SurvivorSet(4, tuple(sorted(names))))
    with pytest.raises(SecAggRefused) as e:  # no holder's signature: nothing is revealed
        c.unmask(UnmaskRequest(4, tuple(sorted(names)), ()))
    one_line(e, "signed the survivor set", "fewer than the threshold")
    with pytest.raises(SecAggRefused) as e:  # a stranger's signature
        c.unmask(UnmaskRequest(4, tuple(sorted(names)), (("eve", b"x"),)))
    one_line(e, "'eve'")
    other = SecAggClient(names[1], p, signer_of(names[1]), verifier(), None, seeded(3))
    other.advertise()
    roster = staged["rosters"][names[1]]
    with pytest.raises(SecAggRefused) as e:  # a roster that changed the client's own keys (a server's swap)
        other.share_keys(roster)
    one_line(e, "own keys unchanged")
    with pytest.raises(SecAggRefused) as e:
        SecAggClient("intruder", p, signer_of(names[0]), verifier())
    one_line(e, "not among the round's")


def test_robust_and_asynchronous_strategies_refuse_secure_aggregation():
    for name in ("median", "trimmed_mean", "krum", "multi_krum", "fedasync", "fedbuff"):
        with pytest.raises(ValueError, match=rf"^strategy '{name}' .*secagg\+") as e:
            check_strategy(get_strategy(name))
        assert "\n" not in str(e.value)
    for name in ("fedavg", "fedprox", "fedadam", "fedyogi", "fedadagrad"):
        check_strategy(get_strategy(name))


def test_codecs_compose_as_word_widths_or_are_refused():
    assert word_bits_for_codec("none") == 32 and word_bits_for_codec("fp16") == word_bits_for_codec("bf16") == 16
    for codec in ("int8_block", "ef(int8_block)", "topk(0.1)", "svd(0.5)", "fp16(svd(0.6))"):
        with pytest.raises(ValueError, match="does not compose with secure_aggregation") as e:
            word_bits_for_codec(codec)
        assert "\n" not in str(e.value)
    names, xs, ns = updates(6, 500, seed=4, spread=0.01)
    cfg = SecAggConfig(clip_range=0.05, max_weight=1)
    params = cfg.round_params(1, names, 500, b"h" * 16, word_bits=16)
    check_codec_precision("fp16", params.quantizer)
    srv, _, masked = run_round(params, xs, ns, after_shares=names[:1], seed=3)
    assert masked[names[1]].words.dtype == np.uint16 and masked[names[1]].words.nbytes == 2 * 500  # no count word
    s = srv.result()
    ref = sum(np.clip(xs[c].astype(np.float64), -0.05, 0.05) for c in s.survivors)
    assert np.abs(s.vector - ref).max() <= s.error_bound and s.num_examples == 5
    big = cfg.round_params(1, [f"c{i}" for i in range(300)], 10, b"h" * 16, word_bits=16)
    with pytest.raises(ValueError, match="fewer than the codec's 2\\^10"):
        check_codec_precision("fp16", big.quantizer)


def test_sums_of_sums_through_three_combiners_equal_flat_fedavg():
    d, w_cap = 300, 400
    like = {"a": np.zeros((10, 20), np.float32), "b": np.zeros(100, np.float32)}
    order = sorted(like)
    rng = np.random.default_rng(5)
    sums, flat = [], []
    for j, n in enumerate((4, 7, 5)):
        names = [f"c{j}-{i}" for i in range(n)]
        models = {c: {k: rng.normal(0, 0.2, v.shape).astype(np.float32) for k, v in like.items()} for c in names}
        ns = {c: int(rng.integers(1, w_cap)) for c in names}
        xs = {c: flatten(models[c], order) for c in names}
        params = SecAggConfig(max_weight=w_cap).round_params(9, names, d, bytes([j]) * 16)
        srv, _, _ = run_round(params, xs, ns, after_shares=names[:1] if n > 4 else (), seed=j)
        sums.append(srv.result())
        flat += [(models[c], ns[c]) for c in sums[-1].survivors]
    mean, count, bound = reduce_sums(sums)
    ref = fedavg(flat)
    got = unflatten(mean, like, order)
    for k in like:
        assert np.abs(got[k] - ref[k]).max() <= bound + 1e-6
    rm = RunningMean()  # the reducer's existing weighted mean of partials gives the same model
    for s in sums:
        part, n = partial_mean(s)
        rm.add({"v": part}, n)
    assert count == rm.num_examples and np.abs(rm.result()["v"] - mean).max() < 1e-12


def test_harary_graph_is_regular_symmetric_and_seeded_and_the_degree_grows_as_log_n():
    names = [f"n{i}" for i in range(50)]
    g = harary_graph(names, 8, b"x" * 16)
    assert all(len(v) == 8 and c not in v for c, v in g.items())
    assert all(c in g[v] for c, vs in g.items() for v in vs)
    assert g == harary_graph(names, 8, b"x" * 16) != harary_graph(names, 8, b"y" * 16)
    assert all(len(v) == 49 for v in harary_graph(names, 60, b"x").values())
    degrees = [default_degree(n, 0.1) for n in (100, 1000, 10000)]
    assert degrees == sorted(degrees) and degrees[-1] < 2 * degrees[0] and degrees[0] < 99
    # refused at load: the job file's smallest round (min_clients) is checked
    with pytest.raises(ValueError, match=r"threshold=6 with degree 10 for 20 clients must be in \[7, 11\]"):
        SecAggConfig(threshold=6, degree=10, min_clients=20).round_params(1, names, 5, b"z" * 16)
    with pytest.raises(ValueError, match="at least secure_aggregation.min_clients=3 clients"):
        SecAggConfig().round_params(1, names[:2], 5, b"z" * 16)
