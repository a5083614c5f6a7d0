"""Library models as Nebula models: PaddleFormers causal LMs from local checkpoint directories.

`CausalLMRecipe` is a job's recipe with no user code (`recipe: {factory: "nebula.formers:CausalLMRecipe", args:
{from_pretrained: DIR, data: FILE}}`): the model's embeddings, decoder layers, final norm and head become a
`LayeredModel` (`CausalLMLayers`) that `nebula allocate`, the job's `allocation:` and in-cluster layer pipelines
cut, and that the pipeline, data-parallel (DiLoCo) and federated (`make_client`) modes train. Checkpoints are
local directories only (`resolve_pretrained` refuses a hub name in one line); the tokenizer is read from the same
directory. PaddleFormers is an optional extra (`pip install -e '.[formers]'`): this package imports without it and
names the install when a model is first used.
"""
from nebula.formers.checkpoint import FORMERS_INSTALL, CheckpointInfo, FormersError, require_formers, resolve_pretrained
from nebula.formers.client import CausalLMClient, make_client
from nebula.formers.data import TokenData, load_tokenizer, read_lines
from nebula.formers.families import FAMILIES, UNAVAILABLE, Family, family_of
from nebula.formers.layers import IGNORE_INDEX, CausalLMLayers, causal_lm_loss, layer_names
from nebula.formers.loading import kernel_choice, load_causal_lm
from nebula.formers.recipe import CausalLMRecipe, stage_bounds

__all__ = [
    "CausalLMRecipe",
    "CausalLMLayers",
    "CausalLMClient",
    "make_client",
    "CheckpointInfo",
    "FormersError",
    "FORMERS_INSTALL",
    "require_formers",
    "resolve_pretrained",
    "TokenData",
    "load_tokenizer",
    "read_lines",
    "Family",
    "FAMILIES",
    "UNAVAILABLE",
    "family_of",
    "IGNORE_INDEX",
    "causal_lm_loss",
    "layer_names",
    "kernel_choice",
    "load_causal_lm",
    "stage_bounds",
]
