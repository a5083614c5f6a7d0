"""ELECTRA-style multilingual pretraining across clusters (Nebula-I Scenario I, M3): generators per language group
feed one discriminator cluster with token ids only; MRTD, TRTD and CLM."""
from recipes.electra.stages import DiscriminatorStage, ElectraRecipe, GeneratorStage

__all__ = ["ElectraRecipe", "GeneratorStage", "DiscriminatorStage"]
