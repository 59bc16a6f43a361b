"""The recipe JSON Schema, generated from the recipe models.

Why generated: the models are the one source of truth; ``python -m factory.schemas``
writes the schema shipped in ``factory/schemas/recipe.schema.json`` (editors validate
recipes with it; ``load_recipe`` checks a file against it first, for messages that name
the key path) and a test fails while the shipped copy is stale. The schema is that of
``RecipeBase``, every section a file may hold: which sections a kind requires is
checked after it (``factory.recipe.load``), with messages that say which kind needs what.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import GenerateJsonSchema, NoDefault
from pydantic_core import core_schema

from factory.recipe.types import RecipeBase

__all__ = ["SCHEMA_PATH", "json_schema", "shipped_schema"]

SCHEMA_PATH = Path(__file__).parent.parent / "schemas" / "recipe.schema.json"


class _WithFactoryDefaults(GenerateJsonSchema):
    """Also states the defaults made by a ``default_factory`` (an empty list, the vLLM
    command line): an editor and the recipe reference then show them. A factory that
    makes a section (``RetryConfig``) states none: the section's keys carry their own."""

    def get_default_value(self, schema: core_schema.WithDefaultSchema) -> Any:
        factory = schema.get("default_factory")
        if factory is None or schema.get("default_factory_takes_data"):
            return super().get_default_value(schema)
        value = factory()  # type: ignore[call-arg]
        return NoDefault if isinstance(value, BaseModel) else value


def json_schema() -> dict[str, Any]:
    """The recipe JSON Schema, generated from the models above."""
    schema = RecipeBase.model_json_schema(schema_generator=_WithFactoryDefaults)
    schema.pop("description", None)  # RecipeBase's docstring speaks to developers
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "factory recipe"
    return schema


def shipped_schema() -> dict[str, Any]:
    return json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))
