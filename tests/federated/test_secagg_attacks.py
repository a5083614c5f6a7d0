"""The lying combiner's attacks on SecAgg+, each against the pure state machines: substituted keys, the same model
twice (a replayed round), a shrunk cohort or threshold, different survivor sets told to different clients. Each is
refused with a one-line reason (what the client process audits as `fl.secagg`), and an honest round of the same
clients still closes with the right sum."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from nebula.federated.client.secure import FileJournal
from nebula.federated.secagg import (AdvertiseKeys, KeyRoster, MemoryJournal, SecAggConfig, SecAggRefused,
                                     SecAggServer, UnmaskRequest, crypto, model_digest)
from nebula.federated.secagg.graph import colluders, safe_threshold
from tests.federated.test_secagg import (make_clients, run_round, seeded, signer_of, updates, verifier,
                                         weighted_reference)

MODEL = model_digest({"w": np.arange(6, dtype=np.float32)})


def _params(n=7, round_=1, model=MODEL, session=b"s" * 16, **cfg):
    names, xs, ns = updates(n, 64, seed=n)
    return SecAggConfig(max_weight=1000, **cfg).round_params(round_, names, 64, session, version=3,
                                                             model=model), xs, ns


def _reason(exc: pytest.ExceptionInfo) -> str:
    reason = str(exc.value)
    assert "\n" not in reason
    return reason


def _masked(params, cl, xs, ns, *, withheld=()):
    """A fresh server taken through stage 4 with clients `cl`: every client masks, the `withheld` inputs never
    reach the server."""
    srv = SecAggServer(params)
    for c in params.clients:
        srv.receive_keys(cl[c].advertise())
    for c, r in srv.rosters().items():
        srv.receive_shares(cl[c].share_keys(r))
    for c, dv in srv.deliveries().items():
        srv.receive_check(cl[c].check_shares(dv))
    for c, v in srv.verdicts().items():
        m = cl[c].mask(v, xs[c], ns[c])
        if c not in withheld:
            srv.receive_masked(m)
    return srv


def test_a_substituted_neighbour_key_is_refused_before_anything_is_shared():
    params, xs, ns = _params()
    cl = make_clients(params, seeded(1))
    srv = SecAggServer(params)
    for c in params.clients:
        srv.receive_keys(cl[c].advertise())
    rosters = srv.rosters()
    victim = params.clients[0]
    roster = rosters[victim]
    other = next(k for k in roster.keys if k.client != victim)
    _, evil_pk = crypto.keypair()
    # 1: the combiner's own mask key under the neighbour's unchanged certificate and signature
    swapped = KeyRoster(roster.round, tuple(dataclasses.replace(k, mask_pk=evil_pk) if k is other else k
                                            for k in roster.keys))
    with pytest.raises(SecAggRefused) as e:
        cl[victim].share_keys(swapped)
    assert "substituted key" in _reason(e) and repr(other.client) in _reason(e)
    assert cl[victim].stage == "share_keys"  # nothing shared: a refusal changes nothing
    # 2: signed for real, but with a cluster-mate's certificate (its key is not the neighbour's)
    mate = signer_of("A/99")
    from nebula.federated.secagg.client import keys_statement

    sig = mate.sign(keys_statement(cl[victim].tag, params, other.client, other.cipher_pk, evil_pk))
    forged = KeyRoster(roster.round, tuple(AdvertiseKeys(k.client, k.round, k.cipher_pk, evil_pk, mate.chain, sig)
                                           if k is other else k for k in roster.keys))
    with pytest.raises(SecAggRefused) as e:
        cl[victim].share_keys(forged)
    assert "spiffe://fedtest/worker/A/client-99" in _reason(e)
    # 3: a certificate of another federation's CA (self-made): not issued by the federation CA
    from security.ca import CertificateAuthority
    import tempfile
    from pathlib import Path

    d = Path(tempfile.mkdtemp())
    rogue = CertificateAuthority.init(d / "ca", "fedtest")
    rogue.issue(f"client-{other.client.split('/')[1]}", "worker", "A", out_dir=d, stem="x")
    from nebula.federated.secagg import load_signer

    fake = load_signer(d / "x.pem", d / "x.key")
    sig = fake.sign(keys_statement(cl[victim].tag, params, other.client, other.cipher_pk, evil_pk))
    forged = KeyRoster(roster.round, tuple(AdvertiseKeys(k.client, k.round, k.cipher_pk, evil_pk, fake.chain, sig)
                                           if k is other else k for k in roster.keys))
    with pytest.raises(SecAggRefused, match="not one the federation CA issued"):
        cl[victim].share_keys(forged)
    # the unaltered roster is taken
    assert cl[victim].share_keys(roster).client == victim


def test_a_revoked_certificate_vouches_for_nothing():
    from tests.federated.test_secagg import _ca

    params, xs, ns = _params(n=5)
    revoked = signer_of("A/3", name="revoked-3")
    ca, _ = _ca()
    from cryptography import x509

    ca.revoke(x509.load_pem_x509_certificate(revoked.chain).serial_number)
    v = verifier(named=False)
    from nebula.federated.secagg import SecAggClient

    rb = seeded(2)
    cl = {c: SecAggClient(c, params, revoked if c == "A/3" else signer_of(c), v, None, rb) for c in params.clients}
    srv = SecAggServer(params)
    for c in params.clients:
        srv.receive_keys(cl[c].advertise())
    with pytest.raises(SecAggRefused, match="revoked"):
        cl["A/2"].share_keys(srv.rosters()["A/2"])


def test_the_same_model_twice_is_refused_at_unmask_even_after_a_restart(tmp_path):
    """Round 1 sums everyone; round 2 runs the same model with a fresh session and calls the victim dropped: the
    difference of the sums would be the victim's update. Every other client has revealed shares for that model
    already, so none reveals again (the journal on disk survives a restart), and round 2 unmasks nothing."""
    params1, xs, ns = _params(n=6, round_=1)
    journals = {c: FileJournal(tmp_path / c.replace("/", "-")) for c in params1.clients}
    cl = make_clients(params1, seeded(3), journals)
    srv1, _, _ = run_round(params1, xs, ns, clients=cl)
    s1 = srv1.result()
    assert np.abs(s1.vector - weighted_reference(params1.clients, xs, ns, 1000, 1.0)).max() <= s1.error_bound
    victim = params1.clients[0]
    params2, _, _ = _params(n=6, round_=2, session=b"t" * 16)
    restarted = {c: FileJournal(tmp_path / c.replace("/", "-")) for c in params2.clients}  # a new process
    cl2 = make_clients(params2, seeded(4), restarted)
    srv2 = _masked(params2, cl2, xs, ns, withheld=(victim,))
    for c, ss in srv2.survivor_sets().items():
        srv2.receive_signature(cl2[c].sign_survivors(ss))
    reasons = []
    for c, rq in srv2.unmask_requests().items():
        with pytest.raises(SecAggRefused) as e:
            cl2[c].unmask(rq)
        reasons.append(_reason(e))
    assert len(reasons) == 5 and all("already revealed shares for a round on this model" in r for r in reasons)
    with pytest.raises(SecAggRefused, match="shares of the self-mask seed"):
        srv2.result()
    # a replayed round id on another model is refused too
    j = MemoryJournal()
    j.record(7, MODEL)
    assert "round 7" in j.refusal(7, bytes(32)) and j.refusal(8, bytes(32)) is None


def test_a_shrunk_cohort_or_threshold_is_refused_by_every_client_s_own_config():
    cfg = SecAggConfig(min_clients=5)
    with pytest.raises(ValueError, match=r"min_clients=5 clients in a round, it has 3"):
        cfg.round_params(1, ["A/2", "A/3", "A/4"], 10, bytes(16))
    # the client derives t itself; an explicit one below the colluders' bound is refused at load, in one line
    with pytest.raises(ValueError) as e:
        SecAggConfig(threshold=2)
    assert "threshold=2" in str(e.value) and "colluding" in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(ValueError, match="min_clients=2 is below the minimum 3"):
        SecAggConfig(min_clients=2)
    with pytest.raises(ValueError, match="max_corrupt=0.5"):
        SecAggConfig(max_corrupt=0.5)
    # a cohort of 3 no longer gives t = 2: all three holders are needed (the combiner and one colluder hold 1)
    p3 = SecAggConfig().round_params(1, ["A/2", "A/3", "A/4"], 10, bytes(16))
    assert (p3.degree, p3.threshold) == (2, 3)
    # max_dropout 0 no longer degenerates to k = 2, t = 2: for every n, 2t > k + 1 + c
    for n in (5, 10, 40, 200):
        p = SecAggConfig(max_dropout=0).round_params(1, [f"A/{i}" for i in range(n)], 10, bytes(16))
        c = colluders(n, 0.1)
        assert 2 * p.threshold > p.effective_degree + 1 + min(p.effective_degree, c), (n, p.degree, p.threshold)
        assert p.effective_degree >= 4
    # the defaults, stated: gamma = 0.1, delta = 0.1
    p = SecAggConfig().round_params(1, [f"A/{i}" for i in range(100)], 10, bytes(16))
    assert p.threshold == safe_threshold(p.effective_degree, 10)


def test_different_survivor_sets_to_different_clients_reveal_nothing():
    """The combiner tells half the victim's holders it survived (to get its seed shares) and the other half it
    dropped (to get its mask key shares). Each half signs its own set; no set gathers the threshold's signatures
    among a client's holders, so no client reveals either share."""
    params, xs, ns = _params(n=7)
    t = params.threshold
    cl = make_clients(params, seeded(5))
    srv = _masked(params, cl, xs, ns)
    victim, others = params.clients[0], params.clients[1:]
    everyone = tuple(sorted(params.clients))
    without = tuple(sorted(others))
    from nebula.federated.secagg import SurvivorSet

    half_a, half_b = others[:3], others[3:]
    sigs_a = {c: cl[c].sign_survivors(SurvivorSet(params.round, everyone)).signature for c in half_a}
    sigs_b = {c: cl[c].sign_survivors(SurvivorSet(params.round, without)).signature for c in half_b}
    assert len(half_a) < t and len(half_b) < t  # neither half, with its own signature, reaches the threshold
    for c in half_a:  # all the signatures on its set, and the other half's (on another set) passed off as on it
        sigs = tuple(sorted([(h, s) for h, s in sigs_a.items() if h != c] + list(sigs_b.items())))
        with pytest.raises(SecAggRefused) as e:
            cl[c].unmask(UnmaskRequest(params.round, everyone, sigs))
        assert "does not verify" in _reason(e)
        with pytest.raises(SecAggRefused) as e:
            cl[c].unmask(UnmaskRequest(params.round, everyone, tuple((h, s) for h, s in sigs_a.items() if h != c)))
        assert f"fewer than the threshold {t}" in _reason(e)
    for c in half_b:  # asked on the set it did not sign
        with pytest.raises(SecAggRefused, match="another survivor set than the one this client signed"):
            cl[c].unmask(UnmaskRequest(params.round, everyone, ()))
    assert all(cl[c].stage == "unmask" for c in others)  # nobody revealed anything
    # an honest round of the same clients closes with everyone's sum
    cl2 = make_clients(params, seeded(6))
    srv2, _, _ = run_round(params, xs, ns, clients=cl2)
    assert srv2.result().survivors == everyone


def test_a_client_signs_one_survivor_set_a_round():
    params, xs, ns = _params(n=5)
    cl = make_clients(params, seeded(7))
    srv = _masked(params, cl, xs, ns)
    sets = srv.survivor_sets()
    c = params.clients[1]
    cl[c].sign_survivors(sets[c])
    from nebula.federated.secagg import SurvivorSet

    with pytest.raises(SecAggRefused, match="out of order"):
        cl[c].sign_survivors(SurvivorSet(params.round, tuple(x for x in sets[c].survivors if x != params.clients[0])))
    with pytest.raises(SecAggRefused, match="leaves this client out"):
        cl[params.clients[2]].sign_survivors(SurvivorSet(params.round, (params.clients[0],)))


def test_a_certificate_revoked_during_a_job_stops_vouching_once_the_crl_file_changes(tmp_path):
    """An actor's verifier lives for the whole job: it reads the CRL file again when it changes (keeping the one in
    force when the new one is older or not the CA's), and checks revocation on every signature, cached or not."""
    from cryptography import x509

    from nebula.federated.secagg import load_verifier
    from nebula.federated.secagg.vouch import statement
    from tests.federated.test_secagg import FEDERATION, _ca

    ca, _ = _ca()
    crl = tmp_path / "crl.pem"
    old = ca.write_crl(crl).read_bytes()
    v = load_verifier(ca.cert_path, crl, FEDERATION)
    s = signer_of("A/8", name="revoked-later-8")
    data = statement(b"test", b"keys")
    assert v.refusal("A/8", s.chain, data, s.sign(data)) is None  # checked and cached
    ca.revoke(x509.load_pem_x509_certificate(s.chain).serial_number)
    ca.write_crl(crl)
    assert "revoked" in v.refusal("A/8", s.chain, data, s.sign(data))
    crl.write_bytes(old)  # an older CRL put back: refused, the revocation stands
    import os
    os.utime(crl, ns=(1, 1))
    assert "revoked" in v.refusal("A/8", s.chain, data, s.sign(data))


def test_the_combiner_refuses_a_badly_signed_or_revoked_key_at_stage_one_and_its_neighbours_go_on():
    """With a verifier the combiner checks each client's signature on its keys as the clients do: a key signed by
    another client's certificate, or by a revoked one, is refused there (audited as fl.secagg by the combiner)
    instead of reaching the neighbours, who would each refuse their roster and sit the round out."""
    from cryptography import x509

    from nebula.federated.secagg import SecAggClient
    from tests.federated.test_secagg import _ca

    params, xs, ns = _params(n=5)
    rb = seeded(4)
    cl = make_clients(params, rb)
    srv = SecAggServer(params, verifier())
    forged = SecAggClient("A/3", params, signer_of("A/4"), verifier(), None, rb).advertise()  # A/4's certificate
    with pytest.raises(SecAggRefused, match="keys not signed by its certificate") as exc:
        srv.receive_keys(forged)
    assert _reason(exc)
    revoked = signer_of("A/2", name="revoked-at-stage-one")
    ca, _ = _ca()
    ca.revoke(x509.load_pem_x509_certificate(revoked.chain).serial_number)
    srv = SecAggServer(params, verifier(named=False))
    with pytest.raises(SecAggRefused, match="revoked"):
        srv.receive_keys(SecAggClient("A/2", params, revoked, verifier(named=False), None, rb).advertise())
    for c in params.clients:
        if c != "A/2":
            srv.receive_keys(cl[c].advertise())
    assert "A/2" not in srv.keys and len(srv.keys) == len(params.clients) - 1
