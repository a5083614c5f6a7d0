"""Trust benchmark: what an attacker inside the federation gets, one row per attack, through real processes.

Each attack runs against real `nebula-switch` processes and, for the federated rows, real controller, combiner and
client processes, on loopback, provisioned afresh under a temporary directory; every process is reaped when its
row is done. A hostile SecAgg+ client or combiner is the real program in a process of its own with one step
replaced (`hostile_client`, `lying_combiner`), as a modified program would be. Each cell is measured from what the
processes did: `refused` from exit codes, verdicts, audit records and model values; `audited` names the record the
refusal left in the real audit log (or "-"); `intact` says whether a legitimate transfer, round or reload after or
during the attack succeeded; `detail` gives the one-line refusal or the figure measured. Printed side by side in
one run:

    .venv/bin/python benchmarks/trust.py                 # a minute or two

`--only NAME[,NAME]` runs those rows alone (names in the first column), `--json FILE` also writes the rows.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
import traceback
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import yaml

from nebula.channel import Endpoint
from security.provision import add_cluster, provision, remove_cluster
from testbed.federation import BIN, Switch, edit_yaml, start_switch, wait_audit
from testbed.procs import Procs

REPO = Path(__file__).resolve().parent.parent

STEP_S = 60  # the longest any one command of an attack may take


@dataclass(frozen=True)
class Row:
    """One attack as measured: refused, the audit record it left, whether legitimate use went on, and why."""

    name: str
    attack: str
    refused: bool
    audited: str
    intact: bool
    detail: str


def _found(switch: Switch, pred: Callable[[dict], bool], timeout_s: float = 10.0) -> dict | None:
    """The first record of `switch`'s audit log matching `pred` (waiting for it), or None."""
    try:
        return wait_audit(switch, pred, timeout_s)
    except AssertionError:
        return None


def _records(log: Path) -> list[dict]:
    return [json.loads(line) for line in log.read_text().splitlines() if line.strip()] if log.exists() else []


def _one_line(run: subprocess.CompletedProcess, code: int = 2) -> bool:
    """Refused as the CLI refuses: exit `code`, one line on stderr, no traceback."""
    return run.returncode == code and run.stderr.count("\n") == 1 and "Traceback" not in run.stderr + run.stdout


def _window(text: str, needle: str, width: int) -> str:
    """`text` cut to `width` characters, ending at `needle` (the words that name the problem) if it lies beyond."""
    if len(text) <= width:
        return text
    end = text.find(needle) + len(needle) if needle and needle in text else 0
    if end > width - 3:
        text = "..." + text[end - width + 6:]
    return text if len(text) <= width else text[:width - 3] + "..."


def _said(run: subprocess.CompletedProcess, tmp: Path, needle: str = "", width: int = 62) -> str:
    """The exit code and the refusal's line, paths made relative, cut to `width` around `needle`."""
    line = run.stderr.strip().replace(f"{tmp}/", "").replace("nebula-switch reload: ", "")
    return f"exit {run.returncode}: " + _window(line.replace("nebula-switch: ", ""), needle, width)


def _transfer(src_worker: Path, dst_worker: Path, src: str, dst: str) -> bool:
    """A legitimate message from a worker of cluster `src` to one of `dst`, through their switches, arrives."""
    try:
        with Endpoint.connect(src_worker, job="legit", rank=0, timeout_s=30) as tx, \
                Endpoint.connect(dst_worker, job="legit", rank=0, timeout_s=30) as rx:
            tx.channel(dst, 0, "legit").send(b"legitimate")
            return rx.channel(src, 0, "legit").recv(timeout_s=30) == b"legitimate"
    except Exception:  # noqa: BLE001 (any failure of the legitimate transfer is what this measures)
        return False


def _exited(procs: Procs, p: subprocess.Popen, timeout_s: float) -> int | None:
    """`p`'s exit code once it exits (its output read and dropped); None if it still ran after `timeout_s` (then
    it is stopped)."""
    try:
        p.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        procs.stop(p)
        return None
    return p.returncode


def peers_updates(procs: Procs, tmp: Path) -> list[Row]:
    """Forged, bombed, replayed and rolled-back peers updates given to a running switch with `reload --update`;
    after each, the admin's next real update is taken and a transfer A -> B goes through."""
    from cryptography import x509

    from security.ca import CertificateAuthority
    from security.signing import Statement, crl_number, sha256_hex, sign_statement
    from testbed.updates import bomb_nested, link_up, members, pack, signed, switch_cli, unpack

    out = tmp / "fed"
    provision("acme", ["A", "B", "C"], out)
    cfg = unpack(out / "kits" / "A.tar.gz", tmp / "siteA") / "A" / "switch.yaml"
    kit_crl = (cfg.parent / "crl.pem").read_bytes()
    a = start_switch(procs, cfg)
    start_switch(procs, out / "B" / "switch.yaml")
    start_switch(procs, out / "C" / "switch.yaml")
    link_up(cfg, "C", True)
    wa, wb = cfg.parent / "worker.yaml", out / "B" / "worker.yaml"

    def reload(update: Path) -> subprocess.CompletedProcess:
        return switch_cli("reload", "--config", str(cfg), "--update", str(update))

    def denied(target: str, reason: str) -> str:
        rec = _found(a, lambda r: r["action"] == "peers_update" and r["outcome"] == "denied"
                     and r["target"] == target and r["detail"]["reason"] == reason)
        return "-" if rec is None else f"{rec['action']} ({reason})"

    def link(peer: str, up: bool) -> bool:
        try:
            link_up(cfg, peer, up, timeout_s=15)
            return True
        except AssertionError:
            return False

    rows = []
    # 1. the attack as it was: removed cluster C listed again at revision 99, under the old CRL, unsigned
    real = Path(remove_cluster(out, "C")["updates"]["A"])
    peers = yaml.safe_load(cfg.read_text())["peers"]
    forged = pack(tmp / "A-r99.tar.gz", {
        "update.yaml": yaml.safe_dump({"federation": "acme", "cluster": "A", "revision": 99, "peers": peers}).encode(),
        "crl.pem": kit_crl})
    run = reload(forged)
    forged_row = (_one_line(run) and "is not signed" in run.stderr, denied(forged.name, "unsigned"),
                  _said(run, tmp, "is not signed"))
    # 2. a CA-signed update.yaml nested thousands deep (a YAML bomb the admin's key signed)
    ca = CertificateAuthority.open(out / "ca")
    bomb = bomb_nested(3000)
    crl = ca.crl_path.read_bytes()
    st = Statement("peers_update", "acme", "A", 9, crl_number(x509.load_pem_x509_crl(crl)), ("B",),
                   (("update.yaml", sha256_hex(bomb)), ("crl.pem", sha256_hex(crl))))
    signed_bomb = pack(tmp / "bomb.tar.gz", {"update.yaml": bomb, "crl.pem": crl,
                                              "update.sig": sign_statement(st, ca.cert, ca.key)})
    run = reload(signed_bomb)
    bomb_row = (_one_line(run) and "nests too deeply" in run.stderr, denied(signed_bomb.name, "malformed"),
                _said(run, tmp, "nests too deeply"))
    c_kept = link("C", True)  # (nothing changed: C is still a peer until the admin's update says otherwise)
    taken = reload(real)  # the admin's real update: C removed, its certificates revoked
    r2_taken = taken.returncode == 0 and link("C", False) and link("B", True)
    after_r2 = _transfer(wa, wb, "A", "B")
    rows.append(Row("forged-update", "unsigned peers update: r99, removed C back, old CRL",
                    forged_row[0], forged_row[1], c_kept and r2_taken and after_r2, forged_row[2]))
    rows.append(Row("yaml-bomb", "YAML bomb in a CA-signed peers update", bomb_row[0], bomb_row[1],
                    c_kept and r2_taken and after_r2, bomb_row[2]))
    # 3. the admin's own revision 2 given again (replay), and 4. a newer revision signed with the kit's old CRL
    run = reload(real)
    replay = (_one_line(run) and "revision 2 already" in run.stderr, denied(real.name, "old_revision"),
              _said(run, tmp, "revision 2 already"))
    doc = {**yaml.safe_load(members(real)["update.yaml"]), "revision": 3}
    rolled = signed(ca, tmp / "A-r3-oldcrl.tar.gz", doc, kit_crl)
    run = reload(rolled)
    rollback = (_one_line(run) and "older than number" in run.stderr, denied(rolled.name, "old_crl"),
                _said(run, tmp, "older than number"))
    r3 = reload(Path(add_cluster(out, "D")["updates"]["A"]))  # the admin's next real update still applies
    intact = r3.returncode == 0 and "revision 3" in r3.stdout and _transfer(wa, wb, "A", "B")
    rows.append(Row("replayed-update", "the admin's signed update replayed", *replay[:2], intact, replay[2]))
    rows.append(Row("rolled-back-crl", "CA-signed newer revision with an older CRL", *rollback[:2], intact,
                    rollback[2]))
    return rows


def altered_kit(procs: Procs, tmp: Path) -> list[Row]:
    """A kit file altered at its site: `nebula-switch serve` refuses to start; the restored kit starts."""
    from testbed.updates import unpack

    out = tmp / "fed"
    provision("acme", ["A", "B"], out)
    cfg = unpack(out / "kits" / "B.tar.gz", tmp / "siteB") / "B" / "switch.yaml"
    cert = cfg.parent / "workers" / "worker.pem"
    good = cert.read_bytes()
    cert.write_bytes(good + b"\n")
    p = procs.start([str(BIN / "nebula-switch"), "serve", "--config", str(cfg)], stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE)
    try:
        stdout, stderr = p.communicate(timeout=STEP_S)
    except subprocess.TimeoutExpired:  # it started on the altered kit: not refused
        procs.stop(p)
        stdout, stderr = p.communicate()
    run = subprocess.CompletedProcess(p.args, p.returncode, stdout, stderr)
    refused = _one_line(run) and "was altered since the admin signed the kit" in stderr
    rec = next((r for r in _records(cfg.parent / "audit.log") if r["action"] == "switch_start_failed"
                and "was altered" in r["detail"].get("reason", "")), None)
    cert.write_bytes(good)
    start_switch(procs, out / "A" / "switch.yaml")
    b = start_switch(procs, cfg)
    intact = _found(b, lambda r: r["action"] == "kit_verified") is not None and \
        _transfer(out / "A" / "worker.yaml", cfg.parent / "worker.yaml", "A", "B")
    return [Row("altered-kit", "a kit file altered, then the switch started", refused,
                "-" if rec is None else rec["action"], intact, _said(run, tmp, "was altered"))]


def audit_rewrite(procs: Procs, tmp: Path) -> list[Row]:
    """A switch's audit tail rewritten without its key (the refusals after the last checkpoint a peer holds dropped,
    the chain recomputed): `nebula-admin audit verify` calls it SUSPICIOUS (exit 3); the honest log of a stop its
    peer witnessed verifies OK."""
    from security.audit import PEER_CHECKPOINT_ACTION, read_records
    from testbed.audit import SUSPICIOUS, held, refuse_a_stranger, rewrite_unwitnessed_tail, start_both

    def verify(log: Path) -> tuple[int, str]:
        run = subprocess.run([str(BIN / "nebula-admin"), "audit", "verify", "--log", str(log)], capture_output=True,
                             text=True, timeout=STEP_S)
        return run.returncode, run.stdout.strip()

    fed = provision("fed", ["A", "B"], tmp / "fed")
    a, b = start_both(procs, fed)
    seq = refuse_a_stranger(fed, tmp, a)
    deadline = time.monotonic() + 15
    while not any(s >= seq for s in held(fed, "B", "A")) and time.monotonic() < deadline:
        time.sleep(0.1)
    a.stop()
    log = a.log.parent / "audit.log"
    honest_code, _ = verify(log)  # its peer holds its closing checkpoint: OK
    b.stop()  # the peer gone, A runs again and refuses another stranger: records no witness holds
    a = start_switch(procs, Path(fed["clusters"]["A"]["switch_yaml"]))
    (tmp / "again").mkdir()
    refuse_a_stranger(fed, tmp / "again", a)
    a.stop()
    witnessed = max(held(fed, "B", "A"))
    rejected = sum(r["action"] == "worker_rejected" for r in read_records(log))
    rewrite_unwitnessed_tail(log, witnessed)
    kept = sum(r["action"] == "worker_rejected" for r in read_records(log))
    code, line = verify(log)
    b_log = Path(fed["clusters"]["B"]["switch_yaml"]).parent / "audit.log"
    at_b = next((r for r in _records(b_log) if r["action"] == PEER_CHECKPOINT_ACTION and r["target"] == "A"), None)
    verdict = line.split(" ", 1)[0]
    return [Row("audit-rewrite", "audit tail rewritten without the key",
                code == SUSPICIOUS and verdict == "SUSPICIOUS" and kept < rejected,
                "-" if at_b is None else f"{at_b['action']} (at B)", honest_code == 0,
                f"exit {code} {verdict}: {rejected - kept} refusal(s) cut after seq {witnessed}; honest log exit "
                f"{honest_code}")]


def initial_grant(procs: Procs, tmp: Path) -> list[Row]:
    """A client of a cluster without the job's grant offers the initial model: not asked, audited; the round runs."""
    from testbed.fedruns import initial_from_ungranted

    run = initial_from_ungranted(procs, tmp)
    rec = next((r for r in run.audit if r["action"] == "fl.initial" and r["target"] == "B/2"
                and r["outcome"] == "refused"), None)
    first = run.models[0].clients if run.models else []
    intact = bool(run.rounds) and run.rounds[0].status == "valid" and len(run.models) >= 2
    why = "" if rec is None else _window(rec["detail"]["reason"], "holds no grant for job 'fltest'", 40)
    return [Row("initial-grant", "initial model from a cluster without the job grant",
                first == ["A/2"] and rec is not None, "-" if rec is None else rec["action"], intact,
                f"initial model from {','.join(first) or 'nobody'}; B/2 not asked: {why}")]


def dp_clip(procs: Procs, tmp: Path) -> list[Row]:
    """Central DP: a client skips its clipping and sends a change of norm ~3900; the combiner clips it, the released
    model moves by at most clip_norm, and the ε recorded is dp-accounting's for the sampler run."""
    import dp_accounting

    from testbed.fedruns import CLIP, DELTA, clip_round, dp_reference

    run = clip_round(procs, tmp, "none")
    acc = next((r for r in run.audit["B"] if r["action"] == "fl.update" and r["outcome"] == "accepted"
                and r["target"] == "B/2"), {"detail": {}})
    dp = next((r for r in run.audit["B"] if r["action"] == "fl.dp" and r["detail"].get("clipped")), None)
    priv = run.round.detail["privacy"]
    gauss = dp_accounting.GaussianDpEvent(priv["noise_multiplier"])
    q = priv["sampling_rate"]
    event = gauss if q == 1 else dp_accounting.PoissonSampledDpEvent(q, gauss)
    ref = dp_reference(event, priv["rounds"], priv["accountant"]) if priv["delta"] == DELTA else float("nan")
    eps = priv["epsilon"]
    same = eps is not None and abs(eps - ref) <= 1e-9 * abs(ref) and priv["sampler"] == priv["accounted_sampler"]
    clipped = bool(acc["detail"].get("clipped")) and 0 < run.change < CLIP + 0.05
    return [Row("dp-clip", "central DP: a client sends an unclipped huge update",
                clipped and same, "-" if dp is None else dp["action"],
                run.round.status == "valid" and run.round.num_updates == 3,
                f"norm {acc['detail'].get('norm', 0):.0f} -> model moved {run.change:.3f} (C={CLIP}); "
                f"eps {eps if eps is None else f'{eps:.4g}'} {'=' if same else '!='} dp-accounting {ref:.4g} "
                f"({priv['sampler']})")]


def metrics(procs: Procs, tmp: Path) -> list[Row]:
    """Who reads the metrics: a switch told to serve them off loopback (without `public: true`) refuses to start;
    on loopback, an account refused a route appears only as an opaque id."""
    from nebula.config import load_switch_config
    from switch_server.status import status_path
    from testbed.attackers import add_worker, refused
    from testbed.fedruns import accounts_home

    fed = provision("fed", ["A", "B"], tmp / "fed")
    ya, yb = (Path(fed["clusters"][c]["switch_yaml"]) for c in ("A", "B"))
    ops = add_worker(fed, "A", "opsw", "ops")
    home = accounts_home(tmp / "home", "cluster:B")  # account nebula may reach B; ops holds no grant
    edit_yaml(ya, lambda d: d.update(metrics={"listen": "0.0.0.0:0"}))
    run = subprocess.run([str(BIN / "nebula-switch"), "serve", "--config", str(ya)], capture_output=True, text=True,
                         timeout=STEP_S)
    off_loopback = _one_line(run) and "is not a loopback address" in run.stderr

    def loopback(d: dict) -> None:
        d.pop("metrics", None)
        d["accounts_home"] = os.path.relpath(home, ya.parent)

    edit_yaml(ya, loopback)
    a = start_switch(procs, ya)
    start_switch(procs, yb)
    with Endpoint.connect(ops, job="j", rank=0, timeout_s=30) as oa:
        why = refused(oa, "B")
    rec = _found(a, lambda r: r["action"] == "route_refused" and r["detail"]["account"] == "ops")
    address = json.loads(status_path(load_switch_config(ya)).read_text())["metrics"]
    text = urllib.request.urlopen(f"http://{address}/metrics", timeout=10).read().decode()
    ids = re.findall(r'nebula_switch_route_refused_frames_total\{account="([^"]+)"', text)
    opaque = bool(ids) and all(re.fullmatch(r"acct-[0-9a-f]{12}", i) for i in ids) and '"ops"' not in text
    intact = address.startswith("127.0.0.1:") and "not_authorized" in why and \
        _transfer(Path(fed["clusters"]["A"]["worker_yaml"]), Path(fed["clusters"]["B"]["worker_yaml"]), "A", "B")
    return [Row("metrics", "metrics served off loopback; account names read", off_loopback and opaque,
                "-" if rec is None else rec["action"], intact,
                f"{_said(run, tmp, 'is not a loopback address', 40)}; label {','.join(sorted(set(ids))) or '-'}")]


def secagg_replay(procs: Procs, tmp: Path) -> list[Row]:
    """A secure round replayed: after an honest SecAgg+ round, the controller's state is wiped (its clients' kept)
    and the job run again, so round 1 runs once more on the same initial model; every client refuses to reveal its
    shares a second time (its journal on disk), and the replayed round unmasks nothing."""
    from nebula.federated.controller.trail import ModelTrail
    from testbed.fedjob import federation, start_cluster, start_clients, write_job
    from testbed.fedruns import SECURE, issue_signers

    workers = federation(procs, tmp, clusters=("A",))
    issue_signers(tmp, workers, {"A": 3})
    job = write_job(tmp, workers, {"A": 3}, rounds=1, secure_aggregation=SECURE,
                    validity={"min_updates": 3})
    fl = tmp / "fl"
    runs = []
    for attempt in ("honest", "replay"):
        actor, clients = start_cluster(procs, job, "A"), start_clients(procs, job, "A")
        codes = [_exited(procs, p, 120) for p in (actor, clients)]
        with ModelTrail(fl / "trail") as t:
            runs.append((codes, t.rounds(), t.models()))
        if attempt == "honest":  # the controller forgets: everything but the clients' own directories goes
            for path in fl.iterdir():
                if path.name != "clients":
                    shutil.rmtree(path) if path.is_dir() else path.unlink()
    (codes, rounds, _), (_, again, models) = runs
    refusals = [r for i in range(3) for r in _records(fl / "clients" / f"A-{i}" / "audit.log")
                if r["action"] == "fl.secagg" and r["outcome"] == "refused" and "already revealed" in
                r["detail"].get("reason", "")]
    honest = codes == [0, 0] and [(r.round, r.status, r.num_updates) for r in rounds] == [(1, "valid", 3)]
    unmasked = any(r.status == "valid" for r in again) or len(models) > 1
    why = re.sub(r".*(already revealed shares for [^;]+);.*", r"\1", refusals[0]["detail"]["reason"]) \
        if refusals else "none refused"
    return [Row("secagg-replay", "SecAgg+ round 1 replayed on the same model",
                len(refusals) == 3 and not unmasked,
                "-" if not refusals else f"{refusals[0]['action']} ({refusals[0]['outcome']})", honest,
                f"{len(refusals)}/3 refuse: {_window(why, '', 40)}; unmasked: {'yes' if unmasked else 'nothing'}")]


def hostile_client(cluster: str, index: int, num_clients: dict, cheat: str = "words", **toy) -> object:
    """The toy client (`testbed.toy_client`) in a client process whose SecAgg+ client cheats, as a modified
    client program can: `words` pushes every masked word past what its whole cohort could sum to; `weight` claims
    max_weight + 1 as its public weight, signed with its own certificate; `bad_share` deals its first neighbour a
    share off its signed commitments. (A job file's `client.factory`: every client of the process cheats.)"""
    import dataclasses

    import numpy as np

    from nebula.federated.secagg import SecAggClient
    from nebula.federated.secagg.client import weight_statement
    from testbed.toy_client import make_client

    if cheat == "bad_share":
        _deal_a_bad_share(SecAggClient)
        return make_client(cluster, index, num_clients, **toy)
    honest = getattr(SecAggClient.mask, "honest", SecAggClient.mask)

    def mask(self, verdict, vector, num_examples):
        m = honest(self, verdict, vector, num_examples)
        q = self.params.quantizer
        if cheat == "words":  # as if the cohort's largest honest sum were exceeded twice over
            push = (2 * q.sum_bound([m.weight] * len(self.params.clients)) + 1) % (1 << q.word_bits)
            return dataclasses.replace(m, words=m.words + np.array(push, q.dtype))
        heavy = q.max_weight + 1
        return dataclasses.replace(m, weight=heavy, signature=self.signer.sign(weight_statement(self.tag, self.client,
                                                                                                heavy)))

    mask.honest = honest
    SecAggClient.mask = mask
    return make_client(cluster, index, num_clients, **toy)


def _deal_a_bad_share(client_class: type) -> None:
    """`client_class.share_keys` seals its first neighbour a share that is not on the dealer's committed
    polynomials, under the true key (so the share's key check holds and the combiner can prove the lie)."""
    import dataclasses

    from nebula.federated.secagg import crypto, shamir
    from nebula.federated.secagg.client import share_aad, share_info

    honest = client_class.share_keys

    def share_keys(self, roster):
        msg = honest(self, roster)
        victim = msg.shares[0].receiver
        key = crypto.agree(self._cipher_sk, self._roster[victim].cipher_pk, share_info(self.tag, self.client, victim))
        bad = crypto.seal(key, shamir.SHARE_BYTES * b"\1" + shamir.SHARE_BYTES * b"\2",
                          share_aad(self.tag, self.client, victim))
        return dataclasses.replace(msg, shares=(dataclasses.replace(msg.shares[0], ciphertext=bad), *msg.shares[1:]))

    client_class.share_keys = share_keys


def lying_combiner(argv: list[str]) -> int:
    """`python -m nebula.federated.run` (`argv`) in a process whose SecAgg+ combiner lies: in the roster it relays
    to each client, the mask key of one of that client's neighbours is replaced by one of the combiner's own (the
    neighbour's certificate and signature kept), so that it could unmask that neighbour's input alone."""
    import dataclasses

    from nebula.federated.run import main as run
    from nebula.federated.secagg import KeyRoster, SecAggServer, crypto

    honest = SecAggServer.rosters

    def rosters(self):
        out = {}
        for client, roster in honest(self).items():
            other = next(k for k in roster.keys if k.client != client)
            _, evil = crypto.keypair()
            out[client] = KeyRoster(roster.round, tuple(dataclasses.replace(k, mask_pk=evil) if k is other else k
                                                        for k in roster.keys))
        return out

    SecAggServer.rosters = rosters
    return run(argv)


def _secure_jobs(procs: Procs, tmp: Path, n: dict[str, int]) -> tuple[Path, Callable[[Path, str], Path]]:
    """Clusters A and B with `n` clients each, every client its own signing certificate: the job file of one SecAgg+
    round (controller on A, under tmp/fl; 3 updates needed), and a maker of the same job in a directory of its own
    whose clients run `hostile_client` with a given cheat."""
    from testbed.fedjob import federation, write_job
    from testbed.fedruns import SECURE, issue_signers

    workers = federation(procs, tmp)
    issue_signers(tmp, workers, n)
    common = {"rounds": 1, "secure_aggregation": SECURE, "validity": {"min_updates": 3},
              "controller": {"cluster": "A", "dir": str(tmp / "fl")}}

    def hostile(directory: Path, cheat: str) -> Path:
        return write_job(directory, workers, n, **common,
                         client={"factory": "benchmarks.trust:hostile_client", "args": {"cheat": cheat}})

    return write_job(tmp, workers, n, **common), hostile


def _round_against_a_mean(tmp: Path):
    """The first round of tmp/fl's trail (or None), and how far its model lies from the mean of A's honest clients
    0-2 (the largest coordinate's difference; None when no model was released)."""
    import numpy as np

    from nebula.federated.controller.trail import ModelTrail
    from testbed.fedruns import survivors_mean

    with ModelTrail(tmp / "fl" / "trail") as t:
        rounds, models = t.rounds(), t.models()
        got = t.load(models[-1].version)[0] if len(models) > 1 else None
    want = survivors_mean({"A": [0, 1, 2]})
    err = max(float(np.abs(got[k].astype(np.float64) - want[k]).max()) for k in want) if got is not None else None
    return (rounds[0] if rounds else None), err


def secagg_liars(procs: Procs, tmp: Path) -> list[Row]:
    """A lying combiner and a lying dealer in one SecAgg+ round: B's combiner substitutes a neighbour's mask key in
    every client's roster, and B's three clients refuse to share; A's fourth client deals a bad share, is found by
    the share check, left out and blamed; the round closes with the sum of A's three honest clients."""
    from testbed.fedjob import start_cluster, start_clients

    job, hostile = _secure_jobs(procs, tmp, {"A": 4, "B": 3})
    dealer = hostile(tmp / "dealer", "bad_share")
    actors = [start_cluster(procs, job, "A"),
              procs.python("-c", "import sys; from benchmarks.trust import lying_combiner; "
                           "sys.exit(lying_combiner(sys.argv[1:]))", "cluster", str(job), "--cluster", "B")]
    clients = [start_clients(procs, job, "A", [0, 1, 2]), start_clients(procs, job, "B"),
               start_clients(procs, dealer, "A", [3])]
    codes = [_exited(procs, p, 120) for p in actors + clients]
    rnd, err = _round_against_a_mean(tmp)
    valid = rnd is not None and rnd.status == "valid" and codes[:2] == [0, 0]
    bound = rnd.detail.get("secure", {}).get("error_bound", 0.0) if rnd is not None else 0.0
    honest_a = err is not None and err <= bound + 1e-6
    substituted = [r for i in range(3) for r in _records(tmp / "fl" / "clients" / f"B-{i}" / "audit.log")
                   if r["action"] == "fl.secagg" and r["outcome"] == "refused"
                   and "substituted key" in r["detail"].get("reason", "")]
    audit_a = _records(tmp / "fl" / "combiner-A" / "audit.log")
    blamed = next((r for r in audit_a if r["action"] == "fl.secagg" and r["outcome"] == "blamed"), None)
    summed = next((r["detail"] for r in audit_a if r["action"] == "fl.secagg" and r["outcome"] == "summed"), {})
    why = "" if blamed is None else re.sub(r".*(dealt '[^']+' a bad share).*", r"\1", blamed["detail"]["reason"])
    return [
        Row("secagg-keys", "SecAgg+ combiner substitutes a neighbour's mask key",
            len(substituted) == 3 and honest_a, "-" if not substituted else
            f"{substituted[0]['action']} ({substituted[0]['outcome']})", valid,
            f"{len(substituted)}/3 of B's clients refuse to share; model = A's mean +-"
            f"{'?' if err is None else f'{err:.0e}'}"),
        Row("secagg-bad-share", "SecAgg+ client deals a share off its commitments",
            blamed is not None and blamed["target"] == "A/5" and summed.get("excluded") == ["A/5"] and honest_a,
            "-" if blamed is None else f"{blamed['action']} ({blamed['outcome']})", valid,
            f"{'nobody' if blamed is None else blamed['target']} blamed: {why}; A sums the other "
            f"{len(summed.get('survivors', []))}"),
    ]


def secagg_cheats(procs: Procs, tmp: Path) -> list[Row]:
    """Two cheating clients in one SecAgg+ round over clusters A and B (three honest clients each): A's claims a
    weight above max_weight (signed), B's sends out-of-range masked words. A's combiner refuses the weight and
    closes with its honest clients' sum; B's sum fails the range check and is dropped with the reason; the round's
    model is the mean of A's honest clients alone."""
    from testbed.fedjob import start_cluster, start_clients

    job, hostile_job = _secure_jobs(procs, tmp, {"A": 4, "B": 4})
    hostile = {c: hostile_job(tmp / f"hostile-{c}", cheat) for c, cheat in (("A", "weight"), ("B", "words"))}
    actors = [start_cluster(procs, job, c) for c in "AB"]
    clients = [start_clients(procs, job, c, [0, 1, 2]) for c in "AB"]
    cheaters = [start_clients(procs, hostile[c], c, [3]) for c in "AB"]
    codes = [_exited(procs, p, 120) for p in actors + clients + cheaters]
    audit = {c: _records(tmp / "fl" / f"combiner-{c}" / "audit.log") for c in "AB"}
    rnd, err = _round_against_a_mean(tmp)
    valid = rnd is not None and rnd.status == "valid" and codes[:4] == [0, 0, 0, 0]
    bound = rnd.detail.get("secure", {}).get("error_bound", 0.0) if rnd is not None else 0.0
    honest_a = err is not None and err <= bound + 1e-6
    heavy = next((r for r in audit["A"] if r["action"] == "fl.secagg" and r["outcome"] == "refused"
                  and "A/5" in [r["target"], *r["detail"].get("clients", [])]), None)
    summed_a = next((r["detail"] for r in audit["A"] if r["action"] == "fl.secagg" and r["outcome"] == "summed"), {})
    out_of_range = [r for r in (rnd.rejected if rnd is not None else []) if "out-of-range" in str(r)]
    words_audit = next((r for r in audit["B"] if r["action"] == "fl.secagg" and "out-of-range" in json.dumps(r)),
                       None)
    weight_why = "" if heavy is None else \
        re.sub(r".*(an integer in \[1, \d+\]; got \d+).*", r"weight \1", heavy["detail"].get("reason", ""))
    words_why = "" if words_audit is None else \
        re.sub(r".*secure sum: (\S+ of \S+ coordinates lie outside \S+),.*", r"\1", words_audit["detail"]["reason"])
    return [
        Row("secagg-weight", "SecAgg+ client forces its weight (max_weight + 1)",
            heavy is not None and "A/5" not in summed_a.get("survivors", ["A/5"]) and honest_a,
            "-" if heavy is None else f"{heavy['action']} ({heavy['outcome']})", valid,
            f"A/5 refused: {_window(weight_why, '', 40)}; A sums the other 3"),
        Row("secagg-words", "SecAgg+ client sends out-of-range masked words",
            bool(out_of_range) and honest_a,
            "-" if words_audit is None else f"{words_audit['action']} ({words_audit['outcome']})", valid,
            f"B's sum refused: {_window(words_why, '', 40)}; model = A's mean "
            f"+-{'?' if err is None else f'{err:.0e}'}"),
    ]


GROUPS: list[tuple[tuple[str, ...], Callable[[Procs, Path], list[Row]]]] = [
    (("forged-update", "yaml-bomb", "replayed-update", "rolled-back-crl"), peers_updates),
    (("altered-kit",), altered_kit),
    (("audit-rewrite",), audit_rewrite),
    (("initial-grant",), initial_grant),
    (("dp-clip",), dp_clip),
    (("metrics",), metrics),
    (("secagg-replay",), secagg_replay),
    (("secagg-keys", "secagg-bad-share"), secagg_liars),
    (("secagg-weight", "secagg-words"), secagg_cheats),
]
NAMES = [n for names, _ in GROUPS for n in names]


def run_group(names: tuple[str, ...], fn: Callable[[Procs, Path], list[Row]], tmp: Path) -> list[Row]:
    """The rows of one attack group, its processes reaped; a group that fails is shown as such, never skipped."""
    procs = Procs()
    tmp.mkdir(parents=True)
    try:
        return fn(procs, tmp)
    except Exception as exc:  # noqa: BLE001 (the table says what went wrong; the traceback goes to stderr)
        traceback.print_exc()
        said = " ".join(f"{type(exc).__name__}: {exc}".split())[:70]
        return [Row(n, n, False, "-", False, f"did not run to the end: {said}") for n in names]
    finally:
        procs.reap()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="", help=f"comma-separated row names: {', '.join(NAMES)}")
    ap.add_argument("--json", type=Path, help="also write the rows to this file")
    args = ap.parse_args()
    only = [w.strip() for w in args.only.split(",") if w.strip()]
    unknown = sorted(set(only) - set(NAMES))
    if unknown:
        ap.error(f"--only {','.join(unknown)}: no such row; the rows are {', '.join(NAMES)}")
    root = Path(tempfile.mkdtemp(prefix="nebula-trust-"))
    rows: list[Row] = []
    t0 = time.monotonic()
    try:
        for names, fn in GROUPS:
            if only and not set(only) & set(names):
                continue
            got = run_group(names, fn, root / fn.__name__)
            rows += [r for r in got if not only or r.name in only]
    finally:
        shutil.rmtree(root, ignore_errors=True)
    yn = {True: "yes", False: "no"}
    print(f"\n{len(rows)} attacks through real switch and federated processes on loopback, "
          f"{time.monotonic() - t0:.0f} s")
    print(f"{'row':<18}{'attack':<54}{'refused':<9}{'audited':<29}{'intact':<8}detail")
    for r in rows:
        print(f"{r.name:<18}{r.attack:<54}{yn[r.refused]:<9}{r.audited:<29}{yn[r.intact]:<8}{r.detail}")
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in rows], indent=1) + "\n")


if __name__ == "__main__":
    main()
