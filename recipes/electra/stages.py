"""The ELECTRA recipe on the Scenario I runtime: one generator stage per language group, one discriminator stage.

Job stages: ``gen_<group>`` (one per group, each on its own cluster) then ``disc`` (the discriminator cluster), in
``mode: oneway``. A generator reads only its group's examples, masks and samples, trains its masked LM and sends the
corrupted ids with their labels; the discriminator learns MRTD/TRTD and CLM from every generator. Loss: generator MLM
+ lambda * RTD + mu * CLM (lambda = 50, mu = 1). Adam, linear warm-up then linear decay.
"""
from __future__ import annotations

import hashlib
import time
from pathlib import Path
from typing import Any

import numpy as np
import paddle

from nebula.pipeline import Recipe, Stage, StageContext, StageOutput
from recipes.text.tokenizer import MASK_ID, PAD_ID
from recipes.electra.data import TOKENIZER_FILE, TRTD, load_group, read_meta
from recipes.electra.model import (Discriminator, Generator, clm_loss, corrupt, gumbel_sample, mask_positions,
                                   mlm_loss, pack, preset, rtd_loss, unpack)

__all__ = ["ElectraRecipe", "GeneratorStage", "DiscriminatorStage", "NUM_EXAMPLES"]

NUM_EXAMPLES = 1 << 18  # example ids; generator g reads example id % (its group's size), so dups mask differently


class _ScheduledAdam(paddle.optimizer.Adam):
    """Adam whose learning-rate schedule advances with every optimizer step (the runtime only calls step)."""

    def step(self) -> None:
        super().step()
        self._learning_rate.step()


def _optimizer(model: paddle.nn.Layer, lr: float, warmup: int, decay_steps: int) -> paddle.optimizer.Optimizer:
    decay = paddle.optimizer.lr.PolynomialDecay(learning_rate=lr, decay_steps=max(decay_steps, 1), end_lr=0.0,
                                                power=1.0)
    sched = paddle.optimizer.lr.LinearWarmup(learning_rate=decay, warmup_steps=max(warmup, 1), start_lr=0.0,
                                             end_lr=lr)
    return _ScheduledAdam(learning_rate=sched, parameters=model.parameters(), beta1=0.9, beta2=0.999, epsilon=1e-6,
                          grad_clip=paddle.nn.ClipGradByGlobalNorm(1.0))


class _Base(Stage):
    def __init__(self, recipe: "ElectraRecipe") -> None:
        self.r = recipe

    def data_dir(self, ctx: StageContext) -> Path:
        """This cluster's data directory (`data` may name `{cluster}`), relative to the job file's directory."""
        p = Path(self.r.data.format(cluster=ctx.cluster))
        return p if p.is_absolute() else ctx.workdir / p

    def signature(self, ctx: StageContext) -> dict[str, Any]:
        """Generator and discriminator must share the vocabulary and sequence length: checked before training."""
        d = self.data_dir(ctx)
        meta = read_meta(d)
        tok = d / TOKENIZER_FILE
        if not tok.is_file():
            raise FileNotFoundError(f"{tok} not found: copy the prepared tokenizer into this cluster's data directory")
        sha = hashlib.sha256(tok.read_bytes()).hexdigest()[:16]
        return {"vocabulary": f"{meta['vocab_size']} pieces, sha256 {sha}", "max_len": meta["max_len"],
                "preset": self.r.preset}


class GeneratorStage(_Base):
    """Masked LM of one language group; sends token ids only."""

    def __init__(self, recipe: "ElectraRecipe", group: str, index: int) -> None:
        super().__init__(recipe)
        self.group, self.index = group, index
        self.data = None

    def build_model(self, ctx: StageContext) -> paddle.nn.Layer:
        """Load this group's examples (an error if it has none), then the generator of the preset."""
        d = self.data_dir(ctx)
        meta = read_meta(d)
        self.vocab_size = int(meta["vocab_size"])
        self.data = load_group(d, self.group)
        if self.r.only_languages:  # e.g. an English-only baseline: monolingual rows of these languages only
            langs = list(meta["languages"])
            keep = np.isin(self.data.lang, [langs.index(x) for x in self.r.only_languages if x in langs])
            keep &= self.data.task != TRTD
            if not keep.any():
                raise ValueError(f"group {self.group!r} has no monolingual text in {list(self.r.only_languages)}; "
                                 "fix only_languages or the groups")
            self.data = type(self.data)(self.data.ids[keep], self.data.lang[keep], self.data.task[keep])
        cfg = preset(self.r.preset).generator.replace(vocab_size=self.vocab_size, max_positions=meta["max_len"])
        return Generator(cfg)

    def build_optimizer(self, model: paddle.nn.Layer, ctx: StageContext) -> paddle.optimizer.Optimizer:
        """Adam, linear warm-up then linear decay."""
        return _optimizer(model, self.r.gen_lr, self.r.warmup_steps, self.r.decay_steps)

    def load(self, ids: np.ndarray, ctx: StageContext) -> Any:
        """Rows of this group for example ids, and their corruption noise (pure function of seed and id)."""
        n = len(self.data.ids)
        rows = (np.asarray(ids) * 2654435761 % n).astype(np.int64)  # spread ids over the group's examples
        x = self.data.ids[rows].astype(np.int64)
        width = max(int((x != PAD_ID).sum(1).max()), 2)
        rngs = [np.random.default_rng((ctx.seed, self.index, int(i))) for i in ids]
        masks = np.stack([mask_positions(x[b], rngs[b], self.r.mask_rate) for b in range(len(ids))])
        return {"ids": x[:, :width], "mask": masks[:, :width], "rngs": rngs, "lang": self.data.lang[rows],
                "task": self.data.task[rows]}

    def forward(self, model: paddle.nn.Layer, batch: Any, received: Any) -> StageOutput:
        """Masked LM loss; sample replacements with Gumbel noise; send (corrupted ids, labels)."""
        ids, mask = batch["ids"], batch["mask"]
        inp = np.where(mask, MASK_ID, ids)
        logits = model(paddle.to_tensor(inp), paddle.to_tensor(mask))
        targets = ids[mask]
        loss = mlm_loss(logits, paddle.to_tensor(targets))
        lg = logits.detach().numpy()
        counts = mask.sum(1)
        noise = np.concatenate([batch["rngs"][b].random((int(c), lg.shape[1])) for b, c in enumerate(counts)])
        sampled = gumbel_sample(lg, noise)
        corrupted, replaced = corrupt(ids, mask, sampled)
        send = pack(batch["lang"], batch["task"], corrupted, ids, replaced, self.vocab_size)
        metrics = {"gen_ok": float((lg.argmax(1) == targets).sum()), "gen_n": float(len(targets)),
                   "replaced": float(replaced.sum()), "masked": float(mask.sum())}
        return StageOutput(send=paddle.to_tensor(send), loss=loss, metrics=metrics)


class DiscriminatorStage(_Base):
    """Learns MRTD / TRTD and CLM from every generator's corrupted ids."""

    def build_model(self, ctx: StageContext) -> paddle.nn.Layer:
        """The discriminator of the preset, sized to the shared vocabulary."""
        meta = read_meta(self.data_dir(ctx))
        self.languages = list(meta["languages"])
        cfg = preset(self.r.preset).discriminator.replace(vocab_size=int(meta["vocab_size"]),
                                                          max_positions=meta["max_len"])
        return Discriminator(cfg)

    def build_optimizer(self, model: paddle.nn.Layer, ctx: StageContext) -> paddle.optimizer.Optimizer:
        """Adam, linear warm-up then linear decay."""
        return _optimizer(model, self.r.disc_lr, self.r.warmup_steps, self.r.decay_steps)

    def load(self, ids: np.ndarray, ctx: StageContext) -> Any:
        """Nothing: everything the discriminator learns from arrives from the generators."""
        return None

    def forward(self, model: paddle.nn.Layer, batch: Any, received: paddle.Tensor) -> StageOutput:
        """lambda * RTD + mu * CLM, plus RTD / CLM accuracy per language (TRTD rows counted as en-<lang>)."""
        if self.r.disc_delay_s:
            time.sleep(self.r.disc_delay_s)  # benchmark: emulates slower discriminator hardware
        lang, task, corrupted, replaced, original = unpack(received.numpy())
        valid = corrupted != PAD_ID
        v = paddle.to_tensor(valid)
        rtd_logits, clm_logits = model(paddle.to_tensor(corrupted), v)
        rtd = rtd_loss(rtd_logits, paddle.to_tensor(replaced), v)
        clm = clm_loss(clm_logits, paddle.to_tensor(original[valid]))
        loss = self.r.lambda_rtd * rtd + self.r.mu_clm * clm
        rtd_pred = rtd_logits.detach().numpy() > 0
        clm_pred = np.zeros_like(corrupted)
        clm_pred[valid] = clm_logits.detach().numpy().argmax(1)
        metrics = {"rtd_loss": float(rtd.numpy()), "clm_loss": float(clm.numpy()), "micro_batches": 1.0}
        for b in range(len(lang)):
            name = self.languages[lang[b]] if lang[b] < len(self.languages) else str(lang[b])
            key = f"en-{name}" if task[b] == TRTD else name
            vb = valid[b]
            for k, val in ((f"rtd_ok/{key}", (rtd_pred[b] == replaced[b])[vb].sum()), (f"n/{key}", vb.sum()),
                           (f"clm_ok/{key}", (clm_pred[b] == original[b])[vb].sum()),
                           (f"rep_n/{key}", replaced[b].sum()),
                           (f"rep_ok/{key}", (rtd_pred[b] & replaced[b]).sum())):
                metrics[k] = metrics.get(k, 0.0) + float(val)
        return StageOutput(loss=loss, metrics=metrics)


class ElectraRecipe(Recipe):
    """ELECTRA-style multilingual pretraining, M3: stages gen_<group> (one per group) and disc."""

    def __init__(self, *, data: str = "data", groups: list[str] | tuple[str, ...] = ("romance_germanic", "slavic_cjk"),
                 preset: str = "tiny", lambda_rtd: float = 50.0, mu_clm: float = 1.0, mask_rate: float = 0.15,
                 gen_lr: float = 5e-4, disc_lr: float = 5e-4, warmup_steps: int = 20, decay_steps: int = 1000,
                 disc_delay_s: float = 0.0, only_languages: list[str] | None = None) -> None:
        from recipes.electra.model import preset as lookup

        lookup(preset)
        if not lambda_rtd > 0:
            raise ValueError(f"lambda_rtd={lambda_rtd} must be > 0: the RTD loss is what trains the discriminator "
                             "(the paper uses 50)")
        if mu_clm < 0:
            raise ValueError(f"mu_clm={mu_clm} must be >= 0 (0 turns CLM off; the paper uses 1)")
        if not 0 < mask_rate < 1:
            raise ValueError(f"mask_rate={mask_rate} must be in (0, 1); ELECTRA masks 0.15")
        if not groups or len(set(groups)) != len(groups):
            raise ValueError(f"groups={list(groups)} must name at least one language group, each once")
        if warmup_steps < 0 or decay_steps < 1 or gen_lr <= 0 or disc_lr <= 0 or disc_delay_s < 0:
            raise ValueError("warmup_steps >= 0, decay_steps >= 1, learning rates > 0 and disc_delay_s >= 0 needed")
        self.data, self.groups, self.preset = data, tuple(groups), preset
        self.lambda_rtd, self.mu_clm, self.mask_rate = float(lambda_rtd), float(mu_clm), float(mask_rate)
        self.gen_lr, self.disc_lr, self.warmup_steps, self.decay_steps = gen_lr, disc_lr, warmup_steps, decay_steps
        self.disc_delay_s = float(disc_delay_s)
        self.only_languages = tuple(only_languages or ())
        self.stage_names = tuple(f"gen_{g}" for g in self.groups) + ("disc",)
        self.num_examples = NUM_EXAMPLES
        self._stages: dict[str, Stage] = {f"gen_{g}": GeneratorStage(self, g, i) for i, g in enumerate(self.groups)}
        self._stages["disc"] = DiscriminatorStage(self)

    def stage(self, name: str) -> Stage:
        """The stage called `name`."""
        try:
            return self._stages[name]
        except KeyError:
            raise ValueError(f"ELECTRA recipe has no stage {name!r}; it has {list(self.stage_names)}") from None
