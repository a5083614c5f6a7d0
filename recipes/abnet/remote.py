"""Cross-cluster steps around training: the reachability/consistency handshake and BLEU evaluation over the switches.

Both run as one worker per cluster through `nebula.channel`; only encoder outputs cross the link (never text).
`reach`: each side sends a hash of its training ids and checks the peer's, so a decoder cluster that cannot reach
the encoder cluster (or holds a different split) fails with a clear error before training starts.
`eval`: the encoder cluster encodes the test sentences with the untrained and the trained adapters and sends both;
the decoder cluster translates (mask-predict), scores BLEU and writes eval.json with its hypotheses.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import logging
import sys
import time
from pathlib import Path
from typing import Sequence


__all__ = ["ids_digest", "handshake", "eval_encoder", "eval_decoder", "main", "ReachError"]

log = logging.getLogger(__name__)
_REACH = "abnet-reach"
_EVAL = "abnet-eval"


class ReachError(RuntimeError):
    """The peer cluster is unreachable or disagrees about the data split."""


def ids_digest(ids: Sequence[str]) -> str:
    """Order-free digest of example ids: equal on both clusters iff they hold the same split."""
    return hashlib.sha256("\n".join(sorted(ids)).encode()).hexdigest()[:16]


def _split_ids(data_dir: Path, pair: str, lang: str, split: str) -> list[str]:
    from recipes.text.catalogs import read_side

    f = data_dir / pair / f"{split}.{lang}.tsv"
    if not f.is_file():
        raise FileNotFoundError(f"{f} not found; run `python -m recipes.abnet.prepare data` for this cluster first")
    return read_side(f)[0]


def handshake(worker: str | Path, job: str, peer: str, info: dict, timeout_s: float = 60.0) -> dict:
    """Exchange `info` with rank 0 of cluster `peer`; raise ReachError naming the cause when it fails."""
    from nebula.channel import Endpoint, PeerUnavailable

    try:
        ep = Endpoint.connect(worker, job=job, rank=0, timeout_s=min(timeout_s, 30.0))
    except Exception as exc:  # noqa: BLE001 - any failure here means "cannot reach our own switch"
        raise ReachError(f"cannot connect to this cluster's switch server with {worker}: {exc}; start "
                         "`nebula-switch serve` for this cluster first") from exc
    try:
        ch = ep.channel(peer, 0, _REACH)
        ch.send(json.dumps(info).encode(), lane="control")
        try:
            reply = json.loads(ch.recv(timeout_s=timeout_s))
        except (TimeoutError, PeerUnavailable) as exc:
            raise ReachError(f"cluster {ep.cluster} cannot reach cluster {peer} through the switches within "
                             f"{timeout_s:.0f} s ({exc}); check that {peer}'s switch is running, that both switch "
                             f"configs list each other under peers:, and that {peer} runs its launch script") from exc
        # The peer is connected now; our first copy may have left before it joined (its switch then had nobody to
        # hand it to, and this side would close before the 60 s retransmission): send it again, so it has one.
        ch.send(json.dumps(info).encode(), lane="control")
        ep.flush(timeout_s=10)
        return reply
    finally:
        ep.close(flush_s=2)


def _check_peer(mine: dict, theirs: dict, peer: str) -> None:
    if theirs.get("pair") != mine["pair"] or theirs.get("train_digest") != mine["train_digest"] or \
            theirs.get("test_digest") != mine["test_digest"]:
        raise ReachError(f"cluster {peer} holds a different data split ({theirs}) than this cluster ({mine}); "
                         "prepare both sides from one `python -m recipes.abnet.prepare data` run")


def _load_trained(layer, ckpt_dir: Path, stage: str) -> int:
    """Load the newest checkpoint of `stage` into `layer`; returns its step."""
    import paddle

    steps = sorted(ckpt_dir.glob("step_*"))
    steps = [d for d in steps if (d / stage / "model.pdparams").is_file()]
    if not steps:
        raise FileNotFoundError(f"no checkpoint of stage {stage!r} under {ckpt_dir}; train first")
    layer.set_state_dict(paddle.load(str(steps[-1] / stage / "model.pdparams")))
    return int(steps[-1].name.split("_")[1])


def eval_encoder(cfg, data_dir: Path, work_dir: Path, ckpt_dir: Path, worker: Path, job: str, peer: str,
                 codec: str = "none", timeout_s: float = 120.0) -> int:
    """Encoder cluster's half of evaluation: send encodings (untrained, trained) of every test batch."""
    import paddle

    from nebula.channel import Endpoint

    from .sides import EncoderSide

    side = EncoderSide(data_dir, work_dir, cfg)
    before = side.model
    after = EncoderSide(data_dir, work_dir, cfg).model
    step = _load_trained(after, ckpt_dir, "encoder")
    ids = sorted(side.ids["test"])[: cfg.eval_limit or None]
    ep = Endpoint.connect(worker, job=job, rank=0, timeout_s=30.0)
    try:
        ch = ep.channel(peer, 0, _EVAL)
        ch.send(json.dumps({"n": len(ids), "digest": ids_digest(ids), "step": step}).encode(), lane="control")
        with paddle.no_grad():
            before.eval()
            after.eval()
            for s in range(0, len(ids), cfg.eval_batch):
                src = paddle.to_tensor(side.batch(ids[s : s + cfg.eval_batch]))
                ch.send_tensor(before(src), codec=codec)
                ch.send_tensor(after(src), codec=codec)
        ch.recv(timeout_s=timeout_s)  # the decoder's "done": keeps this side up until everything arrived
    finally:
        ep.close()
    return 0


def eval_decoder(cfg, data_dir: Path, work_dir: Path, ckpt_dir: Path, worker: Path, job: str, peer: str,
                 out_json: Path, codec: str = "none", timeout_s: float = 120.0, source_hidden: int = 0) -> dict:
    """Decoder cluster's half: translate the received encodings, BLEU before/after, hypotheses to `out_json`."""
    from nebula.channel import Endpoint

    from .model import preset
    from .sides import DecoderSide

    hidden = source_hidden or preset(cfg.preset).source.hidden
    side_before = DecoderSide(data_dir, work_dir, cfg, hidden)
    side_after = DecoderSide(data_dir, work_dir, cfg, hidden)
    step = _load_trained(side_after.objective, ckpt_dir, "decoder")
    ids = sorted(side_before.ids["test"])[: cfg.eval_limit or None]
    ep = Endpoint.connect(worker, job=job, rank=0, timeout_s=30.0)
    hyp_before: list[str] = []
    hyp_after: list[str] = []
    t0 = time.time()
    try:
        ch = ep.channel(peer, 0, _EVAL)
        head = json.loads(ch.recv(timeout_s=timeout_s))
        if head["digest"] != ids_digest(ids) or head["step"] != step:
            raise ReachError(f"the encoder cluster evaluates {head} but this cluster has {len(ids)} test ids "
                             f"(digest {ids_digest(ids)}) at checkpoint step {step}; use one data split and one run")
        for _ in range(0, len(ids), cfg.eval_batch):
            hyp_before += side_before.translate(ch.recv_tensor(codec=codec, timeout_s=timeout_s, like="paddle"))
            hyp_after += side_after.translate(ch.recv_tensor(codec=codec, timeout_s=timeout_s, like="paddle"))
        ch.send(b"done", lane="control")
        ep.flush(timeout_s=10)
    finally:
        ep.close()
    result = {
        "pair": cfg.pair, "step": step, "num_test": len(ids),
        "bleu_before": side_before.score(hyp_before, ids), "bleu_after": side_after.score(hyp_after, ids),
        "eval_s": time.time() - t0,
        "hypotheses": [{"id": i, "ref": side_before.text[i], "before": b, "after": a}
                       for i, b, a in zip(ids, hyp_before, hyp_after)],
    }
    out_json.parent.mkdir(parents=True, exist_ok=True)
    out_json.write_text(json.dumps(result, ensure_ascii=False, indent=1))
    return result


def main(argv: list[str] | None = None) -> int:
    """CLI: python -m recipes.abnet.remote {reach,eval} --side encoder|decoder --worker W --peer C --data D ..."""
    p = argparse.ArgumentParser(prog="python -m recipes.abnet.remote", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("cmd", choices=("reach", "eval"))
    p.add_argument("--side", choices=("encoder", "decoder"), required=True)
    p.add_argument("--worker", required=True, help="this cluster's worker.yaml")
    p.add_argument("--peer", required=True, help="the other cluster's id")
    p.add_argument("--data", required=True, help="this cluster's data directory")
    p.add_argument("--work", default=".", help="this cluster's work directory (bases)")
    p.add_argument("--ckpt", default="ckpt", help="checkpoint directory of the training job")
    p.add_argument("--config", default=None, help="TrainConfig YAML")
    p.add_argument("--job", default="abnet")
    p.add_argument("--codec", default="none", help="codec for the encodings sent during evaluation")
    p.add_argument("--out", default="eval.json")
    p.add_argument("--timeout", type=float, default=120.0)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    from nebula.config import ConfigError

    from .trainconfig import TrainConfig, load_train_config

    try:  # before Paddle is imported: a bad train.yaml is one line, at once
        cfg = load_train_config(args.config) if args.config else TrainConfig()
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    data = Path(args.data)
    lang = "en" if args.side == "encoder" else cfg.target_lang
    try:
        if args.cmd == "reach":
            mine = {"pair": cfg.pair, "side": args.side,
                    "train_digest": ids_digest(_split_ids(data, cfg.pair, lang, "train")),
                    "test_digest": ids_digest(_split_ids(data, cfg.pair, lang, "test"))}
            theirs = handshake(args.worker, f"{args.job}-reach", args.peer, mine, args.timeout)
            _check_peer(mine, theirs, args.peer)
            print(f"cluster {args.peer} reachable; same {cfg.pair} split (train {mine['train_digest']})")
            return 0
        if args.side == "encoder":
            return eval_encoder(cfg, data, Path(args.work), Path(args.ckpt), Path(args.worker), f"{args.job}-eval",
                                args.peer, args.codec, args.timeout)
        r = eval_decoder(cfg, data, Path(args.work), Path(args.ckpt), Path(args.worker), f"{args.job}-eval",
                         args.peer, Path(args.out), args.codec, args.timeout)
        print(f"BLEU on {r['num_test']} test sentences: untrained {r['bleu_before']:.2f} -> trained "
              f"{r['bleu_after']:.2f} (step {r['step']})")
        return 0
    except (ReachError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
