"""`CausalLMRecipe`: a library causal LM from a local directory, fine-tuned on a text file, as a job's recipe.

In a job file, with no recipe code::

    recipe:
      factory: "nebula.formers:CausalLMRecipe"
      args: {from_pretrained: ckpt/tiny-llama, data: train.txt, seq_len: 32, lr: 0.001}

Paths under `recipe.args` are read from where `nebula launch` runs. The stages are ranges of the model's layers
(embed, decoder0.., norm, head): `embed` and `head` by default (`num_stages`, or `stage_names`), cut between the
decoder layers evenly, or where `bounds` (written by the job's `allocation:`) says. `num_stages: 1` (stage `model`)
is the whole model, for `mode: data_parallel`.
"""
from __future__ import annotations

from typing import Any, Sequence

from nebula.formers.checkpoint import resolve_pretrained
from nebula.formers.data import TokenData, load_tokenizer, read_lines
from nebula.formers.families import family_of
from nebula.formers.layers import CausalLMLayers
from nebula.hybrid.layered import LayerRangeStage, check_bounds
from nebula.pipeline.stage import Recipe, Stage, StageContext

__all__ = ["CausalLMRecipe", "stage_bounds", "default_stage_names"]


def default_stage_names(num_stages: int) -> tuple[str, ...]:
    """model; or embed, mid1.., head."""
    if num_stages == 1:
        return ("model",)
    return ("embed", *(f"mid{i}" for i in range(1, num_stages - 1)), "head")


def stage_bounds(num_hidden_layers: int, num_stages: int) -> list[int]:
    """Bounds of `num_stages` stages over the model's layers (embed, decoders, norm, head): the decoder layers split
    evenly, the embeddings with the first stage, norm and head with the last (balance.even.even_bounds splits all
    layers alike instead)."""
    if not 1 <= num_stages <= num_hidden_layers:
        raise ValueError(f"num_stages={num_stages} must be between 1 and the model's {num_hidden_layers} decoder "
                         "layers")
    inner = [1 + round(k * num_hidden_layers / num_stages) for k in range(1, num_stages)]
    return [0, *inner, num_hidden_layers + 3]


class _CausalLMStage(LayerRangeStage):
    """A range of the model's layers; peers check they were built from the same model and data shape."""

    def __init__(self, recipe: "CausalLMRecipe", start: int, stop: int) -> None:
        super().__init__(recipe.model, start, stop)
        self.recipe = recipe

    def signature(self, ctx: StageContext) -> dict[str, Any]:
        """Model family, sizes and sequence length: a cluster with another checkpoint is refused at start-up."""
        c = self.recipe.info.config
        return {"model_type": self.recipe.info.model_type, "hidden_size": c.get("hidden_size"),
                "vocab_size": c.get("vocab_size"), "num_layers": self.recipe.model.num_layers,
                "seq_len": self.recipe.seq_len}


class CausalLMRecipe(Recipe):
    """Fine-tune the causal LM in `from_pretrained` on the lines of `data` (see the module docstring)."""

    def __init__(self, *, from_pretrained: str, data: str, seq_len: int = 64, num_stages: int = 2,
                 stage_names: Sequence[str] | None = None, bounds: Sequence[int] | None = None,
                 lr: float = 1e-3, optimizer: str = "adamw", weight_decay: float = 0.0, kernels: Any = "auto",
                 max_examples: int | None = None) -> None:
        self.info = resolve_pretrained(from_pretrained)
        family_of(self.info.model_type)
        if stage_names is not None:
            num_stages = len(stage_names)
        if bounds is not None:
            num_stages = len(bounds) - 1
        self.stage_names = tuple(stage_names) if stage_names is not None else default_stage_names(num_stages)
        if len(set(self.stage_names)) != len(self.stage_names):
            raise ValueError(f"stage_names={list(self.stage_names)} repeats a name")
        texts = read_lines(data)
        if max_examples is not None:
            texts = texts[:max_examples]
        self.seq_len = seq_len
        self.data = TokenData(texts, load_tokenizer(self.info.path), seq_len)
        self.model = CausalLMLayers(self.info, self.data, kernels=kernels, lr=lr, optimizer=optimizer,
                                    weight_decay=weight_decay)
        n = self.info.num_hidden_layers
        self.bounds = check_bounds(bounds if bounds is not None else stage_bounds(n, num_stages),
                                   self.model.num_layers, num_stages)
        self.num_examples = self.data.num_examples

    def layered(self) -> CausalLMLayers:
        """The model as layers (for allocation, in-cluster layer pipelines and profiles)."""
        return self.model

    def stage(self, name: str) -> Stage:
        """The layer range of stage `name`."""
        i = list(self.stage_names).index(name)
        return _CausalLMStage(self, self.bounds[i], self.bounds[i + 1])
