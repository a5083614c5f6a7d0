"""ABNet's train.yaml: the fine-tuning settings both clusters share, loaded without importing Paddle so that a
bad file is reported (one line: the file, the key, the fix) before anything heavy starts."""
from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

__all__ = ["TrainConfig", "load_train_config", "PRESET_NAMES"]


@dataclass(frozen=True, kw_only=True, slots=True)
class TrainConfig:
    """One ABNet fine-tuning run (defaults: the tiny preset, en-es, a few minutes on 2 CPU cores)."""

    preset: Literal["tiny", "small", "paper"] = "tiny"  # recipes.abnet.model.PRESETS
    pair: str = "en-es"
    steps: int = 1200
    batch_size: int = 64  # global batch; split over the data-parallel ranks of each cluster
    lr: float = 2e-3
    warmup_steps: int = 100
    max_len: int = 24  # tokens per side; longer sentences are truncated
    pretrain_steps: int = 400
    pretrain_vocab: int = 1000
    source_pretrained: str = ""  # directory with config.json/model.pdparams/spm.model; empty: pretrain here
    target_pretrained: str = ""
    seed: int = 0
    length_beam: int = 3
    iterations: int = 4
    eval_batch: int = 200
    eval_limit: int = 0  # 0: the whole test split

    def __post_init__(self) -> None:
        if self.preset not in PRESET_NAMES:  # from_dict checks the Literal; this covers TrainConfig(preset=...)
            raise ValueError(f"preset={self.preset!r}: choose one of {', '.join(PRESET_NAMES)}")
        if not self.pair.startswith("en-") or len(self.pair) < 5:
            raise ValueError(f"pair={self.pair!r}: expected 'en-<lang>', e.g. 'en-es' or 'en-zh'")
        for name in ("steps", "batch_size", "max_len", "length_beam", "iterations", "eval_batch", "pretrain_vocab"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)}: must be >= 1")
        if self.lr <= 0:
            raise ValueError(f"lr={self.lr}: must be > 0")
        for name in ("warmup_steps", "pretrain_steps", "eval_limit"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name}={getattr(self, name)}: must be >= 0")

    @property
    def target_lang(self) -> str:
        """Target language code, e.g. 'es'."""
        return self.pair.split("-", 1)[1]

    def replace(self, **kw) -> "TrainConfig":
        """Copy with some fields changed."""
        return dataclasses.replace(self, **kw)


def load_train_config(path: str | Path, **overrides) -> TrainConfig:
    """TrainConfig from a YAML file, then `overrides` (None: not given) applied; ConfigError of one line naming the
    file, the key and the fix (unknown keys, wrong types, bad values)."""
    from nebula.config import ConfigError, load_yaml

    cfg = load_yaml(TrainConfig, path)
    given = {k: v for k, v in overrides.items() if v is not None}
    try:
        return cfg.replace(**given)
    except ValueError as exc:
        raise ConfigError(f"{path} with {', '.join(f'{k}={v!r}' for k, v in given.items())}: {exc}") from None


PRESET_NAMES: tuple[str, ...] = typing.get_args(typing.get_type_hints(TrainConfig)["preset"])
