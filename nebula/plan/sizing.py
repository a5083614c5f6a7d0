"""The size of a job's model, read cheaply (no model built, no weights loaded), for `nebula plan`.

Two numbers change the prediction for a job: its parameter count P (the bytes a data-parallel exchange carries)
and its activation at the cut, global batch x seq_len x hidden (the bytes a pipeline step carries). For
`nebula.formers:CausalLMRecipe` both come from the checkpoint directory: P from the safetensors headers (exact:
every tensor's shape, no data read), else from config.json's sizes; hidden from config.json. Other recipes are not
sized here (`size_job` returns None and the caller falls back to the benchmark table's model).
"""
from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nebula.config.job import JobConfig

__all__ = ["JobSize", "size_job", "config_params", "safetensors_params", "SIZED_RECIPES"]

SIZED_RECIPES = ("nebula.formers:CausalLMRecipe",)
_SEQ_LEN_DEFAULT = 64  # CausalLMRecipe's default seq_len
_HEADER_MAX = 100 * 1024 * 1024  # a safetensors header larger than this is not one


@dataclass(frozen=True)
class JobSize:
    """What the plan needs of a job's model: parameters, hidden size, tokens per optimizer step, and where from."""

    params: int
    hidden: int
    seq_len: int
    global_batch: int
    source: str  # one phrase saying where the numbers were read

    def __post_init__(self) -> None:
        if self.params < 1 or self.hidden < 1 or self.seq_len < 1 or self.global_batch < 1:
            raise ValueError(f"job size: params={self.params}, hidden={self.hidden}, seq_len={self.seq_len} and "
                             f"global_batch={self.global_batch} must all be >= 1")

    @property
    def tokens_per_step(self) -> int:
        """Tokens of one optimizer step: global batch x seq_len."""
        return self.global_batch * self.seq_len

    @property
    def activation_values(self) -> int:
        """Values of the activation at a cut for one step: global batch x seq_len x hidden."""
        return self.tokens_per_step * self.hidden


def _int(config: dict[str, Any], key: str, default: int | None = None) -> int:
    v = config.get(key, default)
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ValueError(f"config.json: {key}={v!r} must be an integer >= 1")
    return v


def config_params(config: dict[str, Any]) -> int:
    """Parameters of a decoder-only causal LM (Llama layout) from its config.json sizes.

    Embeddings V*h; per layer the attention projections (q, o: h x heads*head_dim; k, v: h x kv_heads*head_dim,
    with biases where the config says so), the gated MLP 3*h*I and two norms; the final norm; and an untied head.
    """
    v, h, n = _int(config, "vocab_size"), _int(config, "hidden_size"), _int(config, "num_hidden_layers")
    inter, heads = _int(config, "intermediate_size"), _int(config, "num_attention_heads")
    kv = _int(config, "num_key_value_heads", heads)
    hd = config.get("head_dim") or h // heads
    q, k = heads * hd, kv * hd
    attn = h * q + 2 * h * k + q * h
    if config.get("attention_bias") or config.get("use_bias"):
        attn += q + 2 * k + h
    elif config.get("model_type") in ("qwen2",):  # q, k, v carry biases in this family
        attn += q + 2 * k
    layer = attn + 3 * h * inter + 2 * h
    head = 0 if config.get("tie_word_embeddings") else v * h
    return v * h + n * layer + h + head


def safetensors_params(directory: Path) -> int | None:
    """Values in every *.safetensors file of `directory`, from their headers alone; None when there is none or
    one cannot be read as safetensors."""
    files = sorted(Path(directory).glob("*.safetensors"))
    if not files:
        return None
    total = 0
    for f in files:
        try:
            with f.open("rb") as fh:
                (n,) = struct.unpack("<Q", fh.read(8))
                if n > _HEADER_MAX:
                    return None
                header = json.loads(fh.read(n))
        except (OSError, ValueError, struct.error):
            return None
        if not isinstance(header, dict):
            return None
        for name, t in header.items():
            if name == "__metadata__":
                continue
            shape = t.get("shape") if isinstance(t, dict) else None
            if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0
                                                      for d in shape):
                return None  # not a safetensors header: the caller falls back to config.json's sizes
            total += math.prod(shape)
    return total or None


def _checkpoint_dir(value: Any, job_file: Path) -> Path:
    """from_pretrained as `nebula launch` reads it (from the current directory), else next to the job file."""
    p = Path(str(value)).expanduser()
    if p.is_absolute() or (p / "config.json").is_file():
        return p
    beside = job_file.resolve().parent / p
    return beside if (beside / "config.json").is_file() else p


def size_job(cfg: JobConfig, job_file: str | Path) -> JobSize | None:
    """The job's model size, or None when its recipe is not one sized here. ValueError (one line naming the file
    and the fix) when the recipe is sizable but its checkpoint cannot be read."""
    if cfg.recipe.factory not in SIZED_RECIPES:
        return None
    args = cfg.recipe.args
    if "from_pretrained" not in args:
        raise ValueError(f"{job_file}: recipe.args has no from_pretrained; point it at the checkpoint directory")
    ckpt = _checkpoint_dir(args["from_pretrained"], Path(job_file))
    cfg_file = ckpt / "config.json"
    try:
        config = json.loads(cfg_file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ValueError(f"{job_file}: recipe.args.from_pretrained: cannot read {cfg_file} ({exc.__class__.__name__}"
                         "); point from_pretrained at a checkpoint directory written by save_pretrained") from None
    if not isinstance(config, dict):
        raise ValueError(f"{cfg_file} is not a JSON object; rewrite it with save_pretrained")
    counted = safetensors_params(ckpt)
    try:
        params = counted if counted is not None else config_params(config)
        hidden = _int(config, "hidden_size")
    except ValueError as exc:
        raise ValueError(f"{cfg_file}: {str(exc).removeprefix('config.json: ')}; rewrite it with save_pretrained") \
            from None
    how = "safetensors headers" if counted is not None else "config.json sizes"
    seq_len = args.get("seq_len", _SEQ_LEN_DEFAULT)
    if isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len < 1:
        raise ValueError(f"{job_file}: recipe.args.seq_len={seq_len!r} must be an integer >= 1")
    return JobSize(params=params, hidden=hidden, seq_len=seq_len,
                   global_batch=cfg.train.global_batch, source=f"{ckpt} ({how})")
