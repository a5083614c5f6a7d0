"""Pretrained bases: load a local directory (own, PaddleNLP BERT / ERNIE-M checkpoints, ELECTRA names) or run a short
masked-LM pretraining. A base this recipe writes is committed by files.json (each file's SHA-256, written last; every
file renamed into place once on disk), so a pretraining killed while saving is redone, not loaded half written."""
from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import paddle
import paddle.nn.functional as F

from nebula.recovery import durable

from .checkpoint import (PADDLENLP_WEIGHTS, PretrainedError, check_preset, fit_state, is_paddlenlp_dir,
                         load_paddlenlp_base, map_foreign_names)
from .model import BertConfig, BertModel, gather_rows, padding_bias
from .tokenizer import MASK_ID, NUM_SPECIAL, PAD_ID, Tokenizer, TokenizerBase, train_tokenizer

__all__ = ["PretrainedError", "save_base", "load_base", "mlm_pretrain", "mlm_loss", "ensure_base", "map_foreign_names"]

log = logging.getLogger(__name__)

CONFIG_FILE, WEIGHTS_FILE, TOKENIZER_FILE, FILES = "config.json", "model.pdparams", "spm.model", "files.json"


def write_base(out_dir: str | Path, state: dict, cfg: dict, tokenizer: str | Path) -> Path:
    """Write a base directory: weights `state`, config `cfg`, a copy of the tokenizer model, then files.json."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / FILES).unlink(missing_ok=True)  # written again: uncommitted until the new files are all in place
    spm = Path(tokenizer).read_bytes()
    files = {WEIGHTS_FILE: durable.write_atomic(out / WEIGHTS_FILE, lambda p: paddle.save(state, str(p))),
             TOKENIZER_FILE: durable.write_atomic(out / TOKENIZER_FILE, lambda p: p.write_bytes(spm)),
             CONFIG_FILE: durable.write_atomic(out / CONFIG_FILE, lambda p: p.write_text(json.dumps(cfg, indent=1)))}
    durable.write_marker(out / FILES, {"files": files})
    return out


def save_base(model: BertModel, tok: Tokenizer, out_dir: str | Path) -> Path:
    """Write config.json, model.pdparams and spm.model of one base into `out_dir` (files.json last)."""
    return write_base(out_dir, model.state_dict(), model.cfg.to_dict(), tok.path)


def _base_problem(d: Path) -> str | None:
    """Why base directory `d` (one this recipe wrote) cannot be loaded: files missing or not matching files.json."""
    missing = [f for f in (CONFIG_FILE, WEIGHTS_FILE, TOKENIZER_FILE) if not (d / f).is_file()]
    if missing:
        return f"lacks {', '.join(missing)}"
    if not (d / FILES).is_file():
        return None  # written before files.json existed, or by hand
    try:
        return durable.check_files(d, durable.read_marker(d / FILES)["files"])
    except durable.CheckpointError as exc:
        return str(exc)


def load_base(path: str | Path, expect: BertConfig | None = None) -> tuple[BertModel, TokenizerBase]:
    """Load one base from `path`: the recipe's own (config.json, model.pdparams, spm.model) or a PaddleNLP BERT /
    ERNIE-M checkpoint with its own tokenizer; every tensor's shape is checked before anything trains."""
    d = Path(path)
    if is_paddlenlp_dir(d):
        return load_paddlenlp_base(d, expect)
    problem = _base_problem(d)
    if problem:
        raise PretrainedError(f"pretrained directory {d}: {problem}; it needs config.json, model.pdparams and "
                              "spm.model as written together by save_base / the recipe's pretraining (delete it to "
                              f"pretrain again), or a PaddleNLP checkpoint ({PADDLENLP_WEIGHTS}, config.json and its "
                              "tokenizer files)")
    try:
        cfg = BertConfig(**json.loads((d / CONFIG_FILE).read_text()))
    except (TypeError, ValueError) as exc:
        raise PretrainedError(f"{d / CONFIG_FILE}: not a BertConfig ({exc})") from exc
    check_preset(cfg, expect, d)
    tok = Tokenizer(d / TOKENIZER_FILE)
    if tok.vocab_size != cfg.vocab_size:
        raise PretrainedError(f"{d}: tokenizer has {tok.vocab_size} pieces but config.json says vocab_size="
                              f"{cfg.vocab_size}; the tokenizer and weights come from different runs")
    model = BertModel(cfg)
    fit_state(model, map_foreign_names(paddle.load(str(d / WEIGHTS_FILE))), d / WEIGHTS_FILE)
    return model, tok


def mlm_loss(model: BertModel, ids: paddle.Tensor, labels: paddle.Tensor) -> paddle.Tensor:
    """Mean masked-LM cross-entropy over positions whose label is not -100 (the head runs on those rows only)."""
    bias = padding_bias(ids)
    x = model.embed(ids)
    for layer in model.layers:
        x = layer(x, bias)
    valid = labels != -100
    logits = model.mlm_logits(gather_rows(x, valid))
    return F.cross_entropy(logits, paddle.masked_select(labels, valid).unsqueeze(-1))


def _mlm_batch(rows: list[list[int]], vocab: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """BERT masking: 15% of tokens are targets; of those 80% [MASK], 10% random, 10% kept."""
    width = max(len(r) for r in rows)
    ids = np.full((len(rows), width), PAD_ID, dtype=np.int64)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = r
    real = ids != PAD_ID
    target = (rng.random(ids.shape) < 0.15) & real
    target[np.arange(len(rows)), 0] |= ~target.any(1)  # at least one target per row
    labels = np.where(target, ids, -100)
    roll = rng.random(ids.shape)
    inp = np.where(target & (roll < 0.8), MASK_ID, ids)
    rand_tok = rng.integers(NUM_SPECIAL, vocab, ids.shape)
    inp = np.where(target & (roll >= 0.8) & (roll < 0.9), rand_tok, inp)
    return inp, labels


def mlm_pretrain(model: BertModel, tok: TokenizerBase, texts: Sequence[str], steps: int, batch_size: int = 64,
                 lr: float = 1e-3, max_len: int = 32, seed: int = 0,
                 progress: Callable[[int, float], None] | None = None) -> list[float]:
    """Masked-LM pretraining of `model` on monolingual `texts`; returns the loss per step."""
    if not texts:
        raise ValueError("mlm_pretrain: no texts; this cluster's training split is empty")
    paddle.seed(seed)
    rng = np.random.default_rng(seed)
    encoded = [r for r in (tok.encode(t, max_len) for t in texts) if r]
    sched = paddle.optimizer.lr.OneCycleLR(max_learning_rate=lr, total_steps=max(steps, 2), phase_pct=0.1)
    opt = paddle.optimizer.AdamW(learning_rate=sched, parameters=model.parameters(), weight_decay=0.01)
    model.train()
    losses = []
    for step in range(steps):
        rows = [encoded[i] for i in rng.integers(0, len(encoded), batch_size)]
        inp, labels = _mlm_batch(rows, tok.vocab_size, rng)
        loss = mlm_loss(model, paddle.to_tensor(inp), paddle.to_tensor(labels))
        loss.backward()
        opt.step()
        opt.clear_grad()
        sched.step()
        losses.append(float(loss))
        if progress:
            progress(step, losses[-1])
    model.eval()
    return losses


def ensure_base(out_dir: str | Path, texts: Sequence[str], cfg: BertConfig, *, pretrained: str | Path | None = None,
                steps: int = 300, vocab_size: int = 1000, character_coverage: float = 1.0, seed: int = 0,
                progress: Callable[[int, float], None] | None = None) -> tuple[BertModel, TokenizerBase]:
    """A base for one side: `pretrained` if given (shape-checked), else a cached or freshly pretrained one in `out_dir`."""
    if pretrained:
        return load_base(pretrained, cfg)
    out = Path(out_dir)
    if (out / FILES).is_file() and (problem := _base_problem(out)) is None:
        return load_base(out, cfg)
    if (out / WEIGHTS_FILE).is_file():  # a save cut short (files.json is written last) or a damaged file
        log.warning("base in %s is not complete (%s); pretraining it again", out,
                    problem if (out / FILES).is_file() else f"no {FILES}: its save was cut short")
    t0 = time.time()
    tok = train_tokenizer(texts, out / "tokenizer" / TOKENIZER_FILE, vocab_size, character_coverage)
    model = BertModel(cfg.replace(vocab_size=tok.vocab_size))
    losses = mlm_pretrain(model, tok, texts, steps, seed=seed, max_len=cfg.max_positions, progress=progress)
    save_base(model, tok, out)
    (out / "pretrain_losses.json").write_text(json.dumps(losses))
    log.info("pretrained base in %s: %d steps, loss %.3f -> %.3f (%.0f s)", out, steps, losses[0], losses[-1],
             time.time() - t0)
    return load_base(out, cfg)
