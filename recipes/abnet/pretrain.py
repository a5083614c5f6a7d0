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

from recipes.text.base import (FILES, TOKENIZER_FILE, WEIGHTS_FILE, PretrainedError, base_problem, load_base,
                               map_foreign_names, save_base)
from recipes.text.bert import BertConfig, BertModel, gather_rows, padding_bias
from recipes.text.tokenizer import MASK_ID, NUM_SPECIAL, PAD_ID, TokenizerBase, train_tokenizer

__all__ = ["PretrainedError", "save_base", "load_base", "mlm_pretrain", "mlm_loss", "ensure_base", "map_foreign_names"]

log = logging.getLogger(__name__)

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
    if (out / FILES).is_file() and (problem := base_problem(out)) is None:
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
