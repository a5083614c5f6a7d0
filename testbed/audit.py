"""The audit log as an attacker without the signing key touches it: records edited and the chain recomputed
(`forge`), the unwitnessed tail cut back (`rewrite_unwitnessed_tail`); and the witnessed-audit set-up of two switches
that hold each other's checkpoints, a stranger refused to leave a record."""
from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path
from typing import Callable

import yaml
from cryptography.hazmat.primitives import serialization

from nebula.channel import Endpoint, SwitchRefused
from security.audit import (CHECKPOINT_ACTION, PEER_CHECKPOINT_ACTION, Checkpoint, checkpoint_of_record,
                            checkpoints_path, peer_checkpoints_path, read_checkpoints, read_records)
from security.curve import write_curve_keypair
from testbed.federation import Switch, start_switch, wait_audit, wait_until

__all__ = ["OK", "SUSPICIOUS", "forge", "held", "lines", "refuse_a_stranger", "rewrite_unwitnessed_tail",
           "set_outcome", "start_both"]

OK, SUSPICIOUS = 0, 3  # exit codes of `nebula-admin audit verify`


def lines(log: Path) -> list[bytes]:
    """The records of `log`, each with its newline."""
    return log.read_bytes().splitlines(keepends=True)


def forge(log: Path, edit: Callable[[list[dict]], list[dict]] = lambda recs: recs, *, resign: Path | None = None,
          drop_checkpoints_after: int | None = None, keep_checkpoint_file: int | None = None) -> None:
    """What an attacker who can write the log (but not read the signing key) does: edit records, renumber, recompute
    every hash; drop checkpoint records after a seq, or re-sign them with `resign`; cut or delete the copies beside."""
    recs = [json.loads(l) for l in lines(log)]
    recs = edit(recs)
    if drop_checkpoints_after is not None:
        recs = [r for r in recs if r["action"] != CHECKPOINT_ACTION or r["seq"] <= drop_checkpoints_after]
    if resign is not None:
        sk = serialization.load_pem_private_key(resign.read_bytes(), password=None)
    out, prev, cps = [], "0" * 64, []
    for seq, r in enumerate(recs, 1):
        r.pop("hash", None)
        r["seq"], r["prev"] = seq, prev
        if resign is not None and r["action"] == CHECKPOINT_ACTION:
            pub = base64.b64encode(sk.public_key().public_bytes(serialization.Encoding.Raw,
                                                                serialization.PublicFormat.Raw)).decode()
            cp = Checkpoint(seq=seq - 1, head=prev, time=r["detail"]["time"], signer=pub, signature="")
            cp = Checkpoint(seq=cp.seq, head=cp.head, time=cp.time, signer=pub,
                            signature=base64.b64encode(sk.sign(cp.message())).decode())
            r["detail"] = dict(json.loads(cp.to_json()), every=r["detail"]["every"])
            cps.append(cp)
        body = json.dumps(r, sort_keys=True, separators=(",", ":"))
        prev = hashlib.sha256(body.encode()).hexdigest()
        out.append(body[:-1] + f',"hash":"{prev}"}}\n')
    log.write_bytes("".join(out).encode())
    cpf = checkpoints_path(log)
    if resign is not None:
        cpf.write_text("".join(c.to_json() + "\n" for c in cps))
    elif keep_checkpoint_file is None:
        cpf.unlink()
    else:
        cpf.write_bytes(b"".join(cpf.read_bytes().splitlines(keepends=True)[:keep_checkpoint_file]))


def set_outcome(seq: int, outcome: str) -> Callable[[list[dict]], list[dict]]:
    """An edit for `forge`: record `seq`'s outcome becomes `outcome`."""
    def edit(recs: list[dict]) -> list[dict]:
        recs[seq - 1]["outcome"] = outcome
        return recs
    return edit


def rewrite_unwitnessed_tail(log: Path, witnessed: int) -> None:
    """The rewrite: cut back to the last witnessed checkpoint (seq `witnessed`), the refusals dropped, the chain
    recomputed (no key needed: the records after it were never signed for anyone outside)."""
    def cut(recs):
        head, tail = recs[:witnessed + 1], recs[witnessed + 1:]
        return head + [r for r in tail if r["action"] not in ("worker_rejected", CHECKPOINT_ACTION)]

    kept = sum(cp.seq <= witnessed for cp in read_checkpoints(checkpoints_path(log)))
    forge(log, cut, keep_checkpoint_file=kept)


def start_both(procs, fed: dict) -> tuple[Switch, Switch]:
    """Switches A and B of provision summary `fed`, started and holding a checkpoint of each other."""
    a = start_switch(procs, Path(fed["clusters"]["A"]["switch_yaml"]))
    b = start_switch(procs, Path(fed["clusters"]["B"]["switch_yaml"]))
    wait_until(lambda: all(any(r["action"] == PEER_CHECKPOINT_ACTION for r in s.audit()) for s in (a, b)), 30,
               "the switches to exchange audit checkpoints")
    return a, b


def held(fed: dict, holder: str, of: str) -> list[int]:
    """Seqs of `of`'s checkpoints that `holder` keeps (beside its log and in its chain)."""
    log = Path(fed["clusters"][holder]["switch_yaml"]).parent / "audit.log"
    seqs = [cp.seq for cp in read_checkpoints(peer_checkpoints_path(log, of))]
    seqs += [checkpoint_of_record(r).seq for r in read_records(log)
             if r["action"] == PEER_CHECKPOINT_ACTION and r["target"] == of]
    return sorted(set(seqs))


def refuse_a_stranger(fed: dict, tmp: Path, a: Switch) -> int:
    """A worker with a key switch A does not know is refused (a security record); that record's seq."""
    src = Path(fed["clusters"]["A"]["worker_yaml"])
    data = yaml.safe_load(src.read_text())
    data["tls"] = {k: str(src.parent / v) for k, v in (data.get("tls") or {}).items()} or None
    data["curve_key"] = str(tmp / "stranger.key_secret")
    data["transport"] = "tcp"
    write_curve_keypair(tmp / "stranger.key_secret")
    (tmp / "stranger.yaml").write_text(yaml.safe_dump({k: v for k, v in data.items() if v is not None}))
    try:
        Endpoint.connect(tmp / "stranger.yaml", job="j", rank=0, timeout_s=15).close()
    except SwitchRefused:
        return wait_audit(a, lambda r: r["action"] == "worker_rejected")["seq"]
    raise AssertionError("switch A let a worker with a key it does not know connect")
