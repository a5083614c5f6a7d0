"""Model families Nebula cuts into layers, registered by the `model_type` of their config.json.

Every registered family has the decoder-only layout of PaddleFormers' causal LMs: ``model.embed_tokens``,
``model.layers[i]`` (called with the causal mask and the rotary position embeddings), ``model.norm``,
``model.rotary_emb`` and ``lm_head``. Families that do not build with the released packages are listed with the
reason, so a job names it in one line instead of failing inside the library.
"""
from __future__ import annotations

from dataclasses import dataclass

from nebula.formers.checkpoint import FormersError

__all__ = ["Family", "FAMILIES", "UNAVAILABLE", "family_of", "KERNEL_FLAGS"]

# the fused kernels of PaddleFormers' configs: on CPU none has a kernel (fused_rms_norm_ext has no CPU kernel)
KERNEL_FLAGS = ("fuse_rms_norm", "use_fused_rope", "use_flash_attention", "fuse_attention_qkv", "fuse_swiglu")


@dataclass(frozen=True, slots=True)
class Family:
    """A model family: the config's `model_type`, the library's causal-LM and config classes."""

    model_type: str
    causal_lm: str  # class name in paddleformers.transformers
    config: str


FAMILIES: dict[str, Family] = {f.model_type: f for f in (
    Family("llama", "LlamaForCausalLM", "LlamaConfig"),
    Family("ernie4_5", "Ernie4_5ForCausalLM", "Ernie4_5Config"),
)}

# PaddleFormers 1.2.0: these modules import gpt_provider, which needs `paddlefleet`, a package the index lacks
_FLEET = ("PaddleFormers 1.2.0 builds {name} through paddleformers.transformers.gpt_provider, which imports "
          "paddlefleet, a package the package index does not carry")
UNAVAILABLE: dict[str, str] = {
    "qwen2": _FLEET.format(name="Qwen2"),
    "qwen3": _FLEET.format(name="Qwen3"),
}


def family_of(model_type: str, where: str = "from_pretrained") -> Family:
    """The registered family of `model_type`, or FormersError naming the supported ones (and why not this one)."""
    fam = FAMILIES.get(model_type)
    if fam is not None:
        return fam
    known = ", ".join(sorted(FAMILIES))
    why = UNAVAILABLE.get(model_type)
    if why:
        raise FormersError(f"{where}: model_type {model_type!r} cannot be built here: {why}; use one of {known}")
    raise FormersError(f"{where}: model_type {model_type!r} is not a supported causal LM family; use one of {known}")
