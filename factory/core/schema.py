"""JSON Schema helpers shared by tool-call validation and domain rules.

Why a module of their own: ``factory.core.validate`` checks calls against tool
schemas and reports paths; ``factory.core.rules`` compiles rule schemas and
reports paths the same way, and ``validate`` takes a ``DomainRules``. With
these helpers in ``validate`` the two modules imported each other.
"""

from __future__ import annotations

import functools
import json
import operator
import re
from collections.abc import Callable, Iterable
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.protocols import Validator
from jsonschema.validators import validator_for

from factory.core.trajectory import canonical_json

__all__ = ["Check", "compile_schema", "fast_check", "format_path"]


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


# --- fast acceptance ----------------------------------------------------------------------------
# jsonschema walks a schema keyword by keyword through generic machinery (about 0.1 ms
# per tool call, the largest cost of post-processing a row: bench postprocess). Nearly
# every call is valid, so a plain predicate compiled once per schema answers "valid"
# and jsonschema runs only when it says "not sure", to find the exact issues. The
# predicate covers the keywords tool schemas and domain rules use, with jsonschema's
# (draft 2020-12) meaning; a schema with any other keyword, or a ``$schema``, gets none.
Check = Callable[[Any], bool]
_ANNOTATIONS = frozenset({"description", "title", "default", "examples", "$comment", "format"})
_KEYWORDS = frozenset(
    {
        "type", "properties", "required", "additionalProperties", "items", "enum", "pattern",
        "minLength", "maxLength", "minItems", "maxItems", "minimum", "maximum",
        "exclusiveMinimum", "exclusiveMaximum",
    }
)  # fmt: skip
_TYPES: dict[str, Callable[[Any], bool]] = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    # jsonschema also counts 1.0 as an integer: left to it (the predicate says "not sure")
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
}


_SIZES: dict[str, tuple[type[str] | type[list[Any]], Callable[[Any, Any], bool]]] = {
    "minLength": (str, operator.ge),
    "maxLength": (str, operator.le),
    "minItems": (list, operator.ge),
    "maxItems": (list, operator.le),
}
_BOUNDS: dict[str, Callable[[Any, Any], bool]] = {
    "minimum": operator.ge,
    "maximum": operator.le,
    "exclusiveMinimum": operator.gt,
    "exclusiveMaximum": operator.lt,
}


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _size_check(
    kind: type[str] | type[list[Any]], compare: Callable[[Any, Any], bool], size: int
) -> Check:
    return lambda v: not isinstance(v, kind) or compare(len(v), size)


def _bound_check(compare: Callable[[Any, Any], bool], bound: Any) -> Check:
    return lambda v: not _is_number(v) or compare(v, bound)


def fast_check(schema: Any) -> Check | None:
    """A predicate true only for instances ``schema`` accepts (false: ask jsonschema),
    or ``None`` when the schema uses a keyword the predicate does not cover."""
    if not isinstance(schema, dict) or "$schema" in schema:
        return None
    return _compile_fast(schema)


def _compile_fast(schema: Any) -> Check | None:
    if schema is True:
        return lambda v: True
    if not isinstance(schema, dict) or not set(schema) <= _KEYWORDS | _ANNOTATIONS:
        return None
    checks: list[Check] = []
    kind = schema.get("type")
    if kind is not None:
        kinds = [kind] if isinstance(kind, str) else kind
        if not isinstance(kinds, list) or not all(k in _TYPES for k in kinds):
            return None
        tests = [_TYPES[k] for k in kinds]
        checks.append(lambda v: any(t(v) for t in tests))
    props = schema.get("properties", {})
    if not isinstance(props, dict):
        return None
    subs: dict[str, Check] = {}
    for name, sub in props.items():
        check = _compile_fast(sub)
        if check is None:
            return None
        subs[name] = check
    extra = schema.get("additionalProperties", True)
    extra_check = None if extra is False else _compile_fast(extra)
    if extra is not False and extra_check is None:
        return None
    required = schema.get("required", [])
    if not isinstance(required, list):
        return None

    def object_ok(v: Any) -> bool:
        if not isinstance(v, dict):
            return True
        if any(r not in v for r in required):
            return False
        for key, item in v.items():
            check = subs.get(key) if isinstance(key, str) else None
            if check is None:
                check = extra_check
            if check is None or not check(item):
                return False
        return True

    if subs or required or extra is not True:
        checks.append(object_ok)
    if "items" in schema:
        item_check = _compile_fast(schema["items"])
        if item_check is None:
            return None
        checks.append(lambda v: not isinstance(v, list) or all(item_check(i) for i in v))
    if "enum" in schema:
        options = schema["enum"]
        if not isinstance(options, list) or not all(isinstance(o, str) for o in options):
            return None
        allowed = frozenset(options)
        checks.append(lambda v: isinstance(v, str) and v in allowed)
    if "pattern" in schema:
        if not isinstance(schema["pattern"], str):
            return None
        regex = re.compile(schema["pattern"])
        checks.append(lambda v: not isinstance(v, str) or regex.search(v) is not None)
    for key, (kind_of, compare) in _SIZES.items():
        if key in schema:
            size = schema[key]
            if not isinstance(size, int) or isinstance(size, bool):
                return None
            checks.append(_size_check(kind_of, compare, size))
    for key, compare in _BOUNDS.items():
        if key in schema:
            bound = schema[key]
            if not _is_number(bound):
                return None
            checks.append(_bound_check(compare, bound))
    return lambda v: all(check(v) for check in checks)
