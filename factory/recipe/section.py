"""The base of every recipe section: strict (an unknown key is an error, not ignored).

Why a module of its own: every section module and the recipe types derive from it, and
none of them may import another only for it (the sections are read independently).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

__all__ = ["Section"]


class Section(BaseModel):
    """A recipe section: unknown keys are refused (a typo must not be silently ignored),
    defaults are validated like written values."""

    model_config = ConfigDict(extra="forbid", validate_default=True)
