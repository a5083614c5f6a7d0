"""ABNet on nebula.pipeline: the encoder stage (cluster A, English only) and the decoder stage (cluster B, target only)."""
from __future__ import annotations

import fcntl
import json
import logging
from pathlib import Path
from typing import Any

import numpy as np
import paddle

from nebula.pipeline import Recipe, Stage, StageContext

from .sides import DecoderSide, EncoderSide, TrainConfig

__all__ = ["ABNetRecipe", "EncoderStage", "DecoderStage", "ScheduledAdam"]

log = logging.getLogger(__name__)


class ScheduledAdam(paddle.optimizer.Adam):
    """Adam whose learning-rate schedule advances on every step (the runtime calls only step/clear_grad)."""

    def step(self) -> None:  # noqa: D102 - same contract as Adam.step
        super().step()
        if isinstance(self._learning_rate, paddle.optimizer.lr.LRScheduler):
            self._learning_rate.step()


def _locked(path: Path):
    """Exclusive lock file: the ranks of one cluster pretrain a missing base once, the others wait and load it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fh = open(path, "w")
    fcntl.flock(fh, fcntl.LOCK_EX)
    return fh


def _num_examples(data_dir: Path, pair: str) -> int:
    manifest = data_dir / pair / "manifest.json"
    if not manifest.is_file():
        raise FileNotFoundError(f"{manifest} not found; run `python -m recipes.abnet.prepare` for this cluster first")
    return int(json.loads(manifest.read_text())["counts"]["train"])


class _SideStage(Stage):
    """What both stages share: the optimizer over the trainable parameters and loading this cluster's side by id."""

    def __init__(self, recipe: "ABNetRecipe") -> None:
        self.r = recipe
        self.side: EncoderSide | DecoderSide | None = None
        self.order: list[str] = []

    def build_optimizer(self, model: paddle.nn.Layer, ctx: StageContext) -> paddle.optimizer.Optimizer:
        """Adam with warmup and linear decay over the trainable parameters (the bases stay frozen)."""
        assert self.side is not None
        return ScheduledAdam(learning_rate=self.side.lr, parameters=self.side.trainable(),
                             grad_clip=paddle.nn.ClipGradByGlobalNorm(1.0))

    def load(self, ids: np.ndarray, ctx: StageContext) -> Any:
        """Token ids of this cluster's side (English or target) for example numbers `ids`."""
        assert self.side is not None
        return paddle.to_tensor(self.side.batch([self.order[int(i)] for i in ids]))


class EncoderStage(_SideStage):
    """Encoder stage: English sentences by example id in, the encoder output (padded rows zero) out."""

    def build_model(self, ctx: StageContext) -> paddle.nn.Layer:
        """Frozen English base (loaded, or pretrained once per cluster) plus trainable adapters."""
        with _locked(self.r.encoder_work / "base.lock"):
            self.side = EncoderSide(self.r.encoder_data, self.r.encoder_work, self.r.cfg)
        self.order = sorted(self.side.ids["train"])
        return self.side.model

    def forward(self, model: paddle.nn.Layer, batch: Any, received: paddle.Tensor | None) -> paddle.Tensor:
        """The boundary tensor [B, S, H]."""
        return model(batch)


class DecoderStage(_SideStage):
    """Decoder stage: target sentences by example id, the CMLM loss on the received encoder output."""

    def build_model(self, ctx: StageContext) -> paddle.nn.Layer:
        """Frozen target base plus cross-attention adapters, length predictor and output layer, wrapped with the loss."""
        with _locked(self.r.decoder_work / "base.lock"):
            self.side = DecoderSide(self.r.decoder_data, self.r.decoder_work, self.r.cfg, self.r.source_hidden)
        self.order = sorted(self.side.ids["train"])
        return self.side.objective

    def forward(self, model: paddle.nn.Layer, batch: Any, received: paddle.Tensor | None) -> paddle.Tensor:
        """Mean CMLM loss of the micro-batch."""
        if received is None:
            raise RuntimeError("the decoder stage needs the encoder output; place the encoder stage before it")
        return model(received, batch)


class ABNetRecipe(Recipe):
    """ABNet (Nebula-I Scenario II): stage "encoder" in the source cluster, stage "decoder" in the target cluster.

    Paths are absolute or relative to the current directory; each cluster needs only its own pair of them
    (encoder_data/encoder_work or decoder_data/decoder_work). Other keyword arguments are TrainConfig fields."""

    stage_names = ("encoder", "decoder")

    def __init__(self, *, encoder_data: str = "", decoder_data: str = "", encoder_work: str = "",
                 decoder_work: str = "", source_hidden: int = 0, config: str = "", **train: Any) -> None:
        from .sides import load_train_config
        from .model import preset

        self.cfg = load_train_config(config, **train) if config else TrainConfig(**train)
        self.encoder_data, self.decoder_data = Path(encoder_data), Path(decoder_data)
        self.encoder_work, self.decoder_work = Path(encoder_work or "."), Path(decoder_work or ".")
        # The decoder's cross-attention needs the encoder's width; without a local source base it comes from here.
        self.source_hidden = source_hidden or preset(self.cfg.preset).source.hidden
        given = ((self.encoder_data, encoder_data), (self.decoder_data, decoder_data))
        counts = [_num_examples(d, self.cfg.pair) for d, arg in given
                  if arg and (d / self.cfg.pair / "manifest.json").is_file()]
        if not counts:
            raise ValueError(f"neither encoder_data={encoder_data!r} nor decoder_data={decoder_data!r} holds "
                             f"{self.cfg.pair}/manifest.json; run `python -m recipes.abnet.prepare` first")
        if len(set(counts)) > 1:
            raise ValueError(f"the clusters' training splits differ in size ({counts}); prepare both from one run")
        self.num_examples = counts[0]

    def stage(self, name: str) -> Stage:
        """The stage called `name` ("encoder" or "decoder")."""
        if name == "encoder":
            return EncoderStage(self)
        if name == "decoder":
            return DecoderStage(self)
        raise ValueError(f"ABNet has stages 'encoder' and 'decoder', not {name!r}")
