"""factory: a Ray-distributed synthetic data factory for tool-using LLM agents.

A seed trajectory flows: ``readers`` (bytes -> raw records) -> ``formats``
(raw record -> canonical ``Trajectory``, with ``repair``) -> ``validate``
(reason-coded issues) -> ``export`` (LLaMA-Factory views) -> ``writer``
(Parquet shards, rejects, manifest). ``run`` is the CLI over all of it;
``runner.run`` the library call behind it. Importing ``factory`` does not
import Ray, aiohttp or the OpenAI SDK.
"""

from __future__ import annotations

from factory.core.compose import CompositionRules
from factory.core.delta import apply, diff
from factory.core.export import check_structure, normalize, to_sharegpt
from factory.core.formats import parse_record
from factory.core.grammar import ActionGrammar
from factory.core.reasons import REASONS, Issue
from factory.core.repair import parse_arguments, parse_json_value, parse_observation
from factory.core.rules import DomainRules
from factory.core.trajectory import ToolCall, Trajectory, Turn
from factory.core.validate import validate, validate_calls
from factory.errors import (
    BudgetExceeded,
    ConfigError,
    FactoryError,
    LLMBadRequest,
    LLMError,
    LLMRateLimited,
    LLMServerError,
    LLMTimeout,
    LLMUnavailable,
    RepairError,
    SeedError,
    SeedFormatError,
    ValidationError,
)
from factory.io.readers import RawRecord, SeedReject, iter_records, read_seeds
from factory.recipe import Recipe, RecipeBase, load_recipe

__version__ = "0.1.0"

__all__ = [
    "REASONS",
    "ActionGrammar",
    "BudgetExceeded",
    "CompositionRules",
    "ConfigError",
    "DomainRules",
    "FactoryError",
    "Issue",
    "LLMBadRequest",
    "LLMError",
    "LLMRateLimited",
    "LLMServerError",
    "LLMTimeout",
    "LLMUnavailable",
    "RawRecord",
    "Recipe",
    "RecipeBase",
    "RepairError",
    "SeedError",
    "SeedFormatError",
    "SeedReject",
    "ToolCall",
    "Trajectory",
    "Turn",
    "ValidationError",
    "__version__",
    "apply",
    "check_structure",
    "diff",
    "iter_records",
    "load_recipe",
    "normalize",
    "parse_arguments",
    "parse_json_value",
    "parse_observation",
    "parse_record",
    "read_seeds",
    "to_sharegpt",
    "validate",
    "validate_calls",
]
