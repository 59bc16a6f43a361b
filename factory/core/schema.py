"""JSON Schema helpers shared by tool-call validation and domain rules.

Why a module of their own: ``factory.core.validate`` checks calls against tool
schemas and reports paths; ``factory.core.rules`` compiles rule schemas and
reports paths the same way, and ``validate`` takes a ``DomainRules``. With
these helpers in ``validate`` the two modules imported each other.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.protocols import Validator
from jsonschema.validators import validator_for

from factory.core.trajectory import canonical_json

__all__ = ["compile_schema", "format_path"]


def compile_schema(schema: Any) -> Validator:
    """A validator for ``schema`` (draft from ``$schema``, default 2020-12), checked once.

    Raises:
        jsonschema.SchemaError: ``schema`` is not a valid JSON Schema (bad regex included).
        TypeError: ``schema`` is not JSON-serialisable.
    """
    return _compile(canonical_json(schema))


@functools.lru_cache(maxsize=1024)
def _compile(schema_json: str) -> Validator:
    schema = json.loads(schema_json)
    cls = validator_for(schema, default=Draft202012Validator)
    cls.check_schema(schema)
    return cls(schema)


def format_path(parts: Iterable[str | int]) -> str:
    """``("passengers", 0, "dob")`` -> ``passengers[0].dob``."""
    out = ""
    for part in parts:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out
