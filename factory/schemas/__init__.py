"""The recipe's generated documents: the shipped JSON Schema (``recipe.schema.json``)
and the documentation site's recipe reference, both from ``factory/recipe/``.

``python -m factory.schemas`` writes them; tests fail while either is stale.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from factory.core.schemadoc import reference_markdown

__all__ = ["recipe_reference"]

_INTRO = """\
Every key a recipe (`pipelines/*.yaml`) may hold, generated from the recipe schema
(`factory/recipe/`, shipped as `factory/schemas/recipe.schema.json`) by
`python -m factory.schemas`; a test fails while this page is stale, so do not edit it by hand.
A recipe with an unknown key, a wrong type or a missing value is refused before any work,
naming the key path. `key[]` is a list item, `key.<name>` a mapping's entry; a default of
`null` means the feature is off (or the value comes from elsewhere, as its text says), and an
empty default means the section fills in its own defaults. How recipes are used:
[Recipes](../recipes.md)."""


def recipe_reference(schema: Mapping[str, Any]) -> str:
    """The recipe reference page (Markdown) for the recipe JSON Schema ``schema``."""
    return reference_markdown(schema, title="Recipe reference", intro=_INTRO)
