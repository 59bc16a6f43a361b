"""The recipe: one typed, resolved value per YAML recipe file.

``load_recipe(path, overrides)`` reads a recipe, checks it against the JSON Schema
generated from these models (key paths in every message), types it as its job kind
(``CurateRecipe``, ``AmplifyRecipe``, ``EnvsimRecipe``, ``MixRecipe``: ``Recipe`` is
their discriminated union) and resolves every path in it. The rest of the factory
reads that value and never calls back into the recipe to find a file.

The package follows the recipe's sections: ``domain`` (the pack), ``llm`` (model,
endpoints, retries, deadlines, a served pool, prices), ``jobs`` (seeds, judge,
amplification, envsim, mixture, parts, quality filters), ``output`` (output folder,
Ray, cache); ``types`` (the recipe types), ``paths`` (finding a recipe, resolving its
paths), ``load`` (validation, overrides, loading) and ``schema`` (the generated JSON
Schema, ``python -m factory.schemas``).
"""

from __future__ import annotations

from factory.recipe.domain import DomainConfig
from factory.recipe.jobs import (
    AmplifyConfig,
    DecontamConfig,
    EnvSimConfig,
    GroundingConfig,
    HeldoutConfig,
    MixtureConfig,
    NearDupConfig,
    PartConfig,
    PrefilterConfig,
    SeedsConfig,
)
from factory.recipe.llm import (
    DeadlineConfig,
    EndpointConfig,
    LLMConfig,
    PriceConfig,
    RetryConfig,
    ServeConfig,
)
from factory.recipe.load import apply_overrides, config_hash, load_recipe, recipe_from_data
from factory.recipe.output import CacheConfig, OutputConfig, RayConfig
from factory.recipe.paths import resolve_recipe_path
from factory.recipe.schema import SCHEMA_PATH, json_schema
from factory.recipe.types import (
    AmplifyRecipe,
    CurateRecipe,
    EnvsimRecipe,
    MixRecipe,
    Recipe,
    RecipeBase,
)

__all__ = [
    "SCHEMA_PATH",
    "AmplifyConfig",
    "AmplifyRecipe",
    "CacheConfig",
    "CurateRecipe",
    "DeadlineConfig",
    "DecontamConfig",
    "DomainConfig",
    "EndpointConfig",
    "EnvSimConfig",
    "EnvsimRecipe",
    "GroundingConfig",
    "HeldoutConfig",
    "LLMConfig",
    "MixRecipe",
    "MixtureConfig",
    "NearDupConfig",
    "OutputConfig",
    "PartConfig",
    "PrefilterConfig",
    "PriceConfig",
    "RayConfig",
    "Recipe",
    "RecipeBase",
    "RetryConfig",
    "SeedsConfig",
    "ServeConfig",
    "apply_overrides",
    "config_hash",
    "json_schema",
    "load_recipe",
    "recipe_from_data",
    "resolve_recipe_path",
]
