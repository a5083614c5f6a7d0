"""The two halves of ABNet as each cluster sees them: the encoder side holds only English, the decoder side only the target."""
from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import paddle

from recipes.text.catalogs import SPLITS, read_side
from .decode import mask_predict
from .evaluate import bleu
from .model import AbnetConfig, AbnetDecoder, AbnetEncoder, CmlmObjective, preset
from .pretrain import ensure_base
from recipes.text.tokenizer import Tokenizer
from .trainconfig import TrainConfig, load_train_config

__all__ = ["TrainConfig", "EncoderSide", "DecoderSide", "epoch_batches", "step_batch", "load_train_config", "eval_ids"]

log = logging.getLogger(__name__)


def epoch_batches(ids: Sequence[str], batch_size: int, seed: int, epoch: int) -> list[list[str]]:
    """Batches of example ids for one epoch: both clusters compute the same list from the ids and the shared seed."""
    order = sorted(ids)
    rng = np.random.default_rng([seed, epoch])
    perm = rng.permutation(len(order))
    return [[order[i] for i in perm[s : s + batch_size]] for s in range(0, len(order) - batch_size + 1, batch_size)]


def step_batch(ids: Sequence[str], step: int, batch_size: int, seed: int, rank: int = 0, world: int = 1) -> list[str]:
    """Ids of this rank's share of global batch number `step` (deterministic, the same on both clusters)."""
    per_epoch = max(1, len(ids) // batch_size)
    if len(ids) < batch_size:
        raise ValueError(f"{len(ids)} training examples are fewer than batch_size={batch_size}; lower batch_size")
    batch = epoch_batches(ids, batch_size, seed, step // per_epoch)[step % per_epoch]
    return batch[rank::world]


def _warmup_lr(cfg: TrainConfig) -> paddle.optimizer.lr.LRScheduler:
    """Linear warmup, then linear decay to 10% at the last step."""
    def factor(step: int) -> float:
        if step < cfg.warmup_steps:
            return (step + 1) / cfg.warmup_steps
        rest = max(1, cfg.steps - cfg.warmup_steps)
        return max(0.1, 1.0 - 0.9 * (step - cfg.warmup_steps) / rest)
    return paddle.optimizer.lr.LambdaDecay(cfg.lr, factor)


class _Side:
    """Texts of one side for every split, keyed by example id, with its tokenizer."""

    lang: str

    def __init__(self, data_dir: str | Path, cfg: TrainConfig, lang: str) -> None:
        self.cfg = cfg
        self.lang = lang
        self.dir = Path(data_dir) / cfg.pair
        self.ids: dict[str, list[str]] = {}
        self.text: dict[str, str] = {}
        for split in SPLITS:
            f = self.dir / f"{split}.{lang}.tsv"
            if not f.is_file():
                raise FileNotFoundError(f"{f} not found; run `python -m recipes.abnet.prepare` to extract the data "
                                        "for this cluster first")
            ids, texts = read_side(f)
            self.ids[split] = ids
            self.text.update(zip(ids, texts))
        self.tok: Tokenizer | None = None

    def batch(self, ids: Sequence[str]) -> np.ndarray:
        """Token ids [len(ids), <= max_len] of the given examples."""
        assert self.tok is not None
        return self.tok.batch([self.text[i] for i in ids], self.cfg.max_len)

    def _base(self, work_dir: Path, bert_cfg, pretrained: str, seed: int,
              progress: Callable[[int, float], None] | None):
        cov = 0.9995 if self.lang.startswith("zh") else 1.0
        texts = [self.text[i] for i in self.ids["train"]]
        base, tok = ensure_base(work_dir / f"base_{self.lang}", texts, bert_cfg, pretrained=pretrained or None,
                                steps=self.cfg.pretrain_steps, vocab_size=self.cfg.pretrain_vocab,
                                character_coverage=cov, seed=seed, progress=progress)
        self.tok = tok
        return base


class EncoderSide(_Side):
    """Cluster A's half: English text only, the frozen English base and the encoder adapters."""

    def __init__(self, data_dir: str | Path, work_dir: str | Path, cfg: TrainConfig,
                 progress: Callable[[int, float], None] | None = None) -> None:
        super().__init__(data_dir, cfg, "en")
        self.model_cfg: AbnetConfig = preset(cfg.preset)
        base = self._base(Path(work_dir), self.model_cfg.source, cfg.source_pretrained, cfg.seed, progress)
        self.model_cfg = dataclasses.replace(self.model_cfg, source=base.cfg)
        paddle.seed(cfg.seed + 1)
        self.model = AbnetEncoder(self.model_cfg, base)
        self.lr = _warmup_lr(cfg)
        self.optimizer = paddle.optimizer.Adam(learning_rate=self.lr, parameters=self.trainable(),
                                               grad_clip=paddle.nn.ClipGradByGlobalNorm(1.0))

    def trainable(self) -> list:
        """Parameters that train (the adapters)."""
        return [p for p in self.model.parameters() if not p.stop_gradient]

    def forward(self, ids: Sequence[str]) -> paddle.Tensor:
        """Encoder output [B, S, H] for the given example ids."""
        return self.model(paddle.to_tensor(self.batch(ids)))


class DecoderSide(_Side):
    """Cluster B's half: target text only, the frozen target base, decoder adapters, CMLM loss and decoding."""

    def __init__(self, data_dir: str | Path, work_dir: str | Path, cfg: TrainConfig, source_hidden: int,
                 progress: Callable[[int, float], None] | None = None) -> None:
        super().__init__(data_dir, cfg, cfg.target_lang)
        mc = preset(cfg.preset)
        base = self._base(Path(work_dir), mc.target, cfg.target_pretrained, cfg.seed + 7, progress)
        self.model_cfg = dataclasses.replace(mc, source=mc.source.replace(hidden=source_hidden), target=base.cfg,
                                             max_target_len=min(mc.max_target_len, cfg.max_len))
        paddle.seed(cfg.seed + 2)
        self.model = AbnetDecoder(self.model_cfg, base)
        self.objective = CmlmObjective(self.model)
        self.lr = _warmup_lr(cfg)
        self.optimizer = paddle.optimizer.Adam(learning_rate=self.lr, parameters=self.trainable(),
                                               grad_clip=paddle.nn.ClipGradByGlobalNorm(1.0))

    def trainable(self) -> list:
        """Parameters that train (adapters, length predictor, output layer when configured)."""
        return [p for p in self.model.parameters() if not p.stop_gradient]

    def loss(self, h: paddle.Tensor, ids: Sequence[str]) -> paddle.Tensor:
        """CMLM loss of the decoder on encoder output `h` for the given example ids."""
        return self.objective(h, paddle.to_tensor(self.batch(ids)))

    def translate(self, h: paddle.Tensor) -> list[str]:
        """Mask-predict translations of a batch of encoder outputs."""
        assert self.tok is not None
        return [self.tok.decode(r) for r in mask_predict(self.model, h, self.cfg.length_beam, self.cfg.iterations)]

    def references(self, ids: Sequence[str]) -> list[str]:
        """Reference translations of the given example ids."""
        return [self.text[i] for i in ids]

    def score(self, hyps: Sequence[str], ids: Sequence[str]) -> float:
        """Case-insensitive corpus BLEU of `hyps` against the references of `ids`."""
        return bleu(hyps, self.references(ids), self.lang)


def eval_ids(side: _Side, split: str = "test") -> list[str]:
    """Ids evaluated on `split` (all, or the first eval_limit in file order)."""
    ids = side.ids[split]
    return ids[: side.cfg.eval_limit] if side.cfg.eval_limit else list(ids)
