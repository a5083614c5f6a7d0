"""A tiny model split into stages: the reference recipe of the pipeline runtime (and its tests and benchmark)."""
from recipes.toy.model import ToyRecipe

__all__ = ["ToyRecipe"]
