"""Loading a recipe: read, override, validate against the schema, type, resolve.

Why in this order: the raw YAML is checked against the shipped JSON Schema first, so
an unknown key, a wrong type or a missing value is reported with its key path
(``llm.sampling.temperature: expected number, got 'hot'``; a misspelt key with the
nearest allowed one: ``did you mean llm.model?``) before any work. Then the sections
each kind of job needs are checked with messages that name the kind (``the amplify
pipeline needs an llm section``), the value is typed as its kind (``Recipe``, a
discriminated union) and every path in it is resolved against the recipe's folder
(``factory.recipe.paths``). What comes out is complete: no later code resolves a
path or asks whether a section is there.
"""

from __future__ import annotations

import datetime
import difflib
import hashlib
import json
import logging
from pathlib import Path
from typing import Any

import jsonschema
from pydantic import TypeAdapter
from pydantic import ValidationError as PydanticValidationError

from factory.core.trajectory import canonical_json
from factory.core.yamlfile import parse_yaml
from factory.errors import ConfigError, short
from factory.recipe.domain import DomainConfig
from factory.recipe.llm import LLMConfig
from factory.recipe.paths import resolve_paths
from factory.recipe.schema import shipped_schema
from factory.recipe.types import Recipe, RecipeBase

__all__ = ["apply_overrides", "config_hash", "load_recipe", "recipe_from_data", "validate_raw"]

log = logging.getLogger(__name__)

_RECIPE: TypeAdapter[Recipe] = TypeAdapter(Recipe)


def _key_path(parts: Any) -> str:
    """Dotted key path, one line; a key that is empty, holds a dot, blank or a control
    character is written as a JSON string (``prices."my model"``) so no step is lost."""
    return ".".join(_key_step(p) for p in parts)


def _key_step(part: Any) -> str:
    text = str(part)
    plain = text.isprintable() and not any(c.isspace() or c in '."' for c in text)
    return text if text and plain else json.dumps(text)


def _format_error(err: jsonschema.ValidationError) -> ConfigError:
    path = _key_path(err.absolute_path)
    v = err.validator
    if v == "additionalProperties":
        allowed = sorted((err.schema.get("properties") or {}).keys())
        # YAML keys may be null, numbers or dates: sort them as text, never by type.
        instance = err.instance if isinstance(err.instance, dict) else {}
        extra = sorted(_key_path([k]) for k in instance if k not in allowed)
        key = f"{path}.{extra[0]}" if path and extra else (extra[0] if extra else path)
        guess = difflib.get_close_matches(extra[0], allowed, n=1, cutoff=0.6) if extra else []
        if guess:
            meant = f"{path}.{guess[0]}" if path else guess[0]
            missing = guess[0] in (err.schema.get("required") or []) and guess[0] not in instance
            also = f" ({meant}: missing required value)" if missing else ""
            return ConfigError(f"unknown key; did you mean {meant}?{also}", key_path=key)
        return ConfigError(f"unknown key (allowed here: {', '.join(allowed)})", key_path=key)
    if v == "required":
        missing = err.message.split("'")[1] if "'" in err.message else err.message
        key = f"{path}.{missing}" if path else missing
        return ConfigError("missing required value", key_path=key)
    if v == "type" or v == "anyOf":
        expected = err.schema.get("type") or [
            s.get("type") for s in err.schema.get("anyOf", []) if "type" in s
        ]
        return ConfigError(
            f"expected {expected}, got {type(err.instance).__name__} {err.instance!r}"[:300],
            key_path=path or "<root>",
        )
    if v == "enum" or v == "const":
        allowed = err.schema.get("enum") or [err.schema.get("const")]
        got = short(repr(err.instance), 100)
        return ConfigError(f"expected one of {allowed}, got {got}", key_path=path or "<root>")
    return ConfigError(err.message[:300], key_path=path or "<root>")


_RELEVANCE = jsonschema.exceptions.by_relevance()


def _relevance(error: jsonschema.ValidationError) -> tuple[Any, ...]:
    """jsonschema's ranking, with paths compared as text: YAML keys may be numbers or
    null, and ranking sibling errors compares their paths (TypeError for 0 < "a")."""
    deeper, path, *rest = _RELEVANCE(error)
    return (deeper, tuple(str(p) for p in path), *rest)


_JSON_LEAVES = (str, int, float, bool, type(None))


def _check_json_data(raw: dict[str, Any]) -> None:
    """Refuse what YAML has and JSON has not: a key that is not text (``null:``, ``1:``)
    or a value that is bytes (``!!binary``), a date or a set.

    JSON Schema only knows JSON: jsonschema drops a null key from an error's path
    (naming the wrong field), and free-form sections (``llm.sampling``) would pass
    bytes or a date on to the config hash and the request body, which cannot
    encode them.
    """
    todo: list[tuple[list[Any], Any]] = [([], raw)]
    while todo:
        path, node = todo.pop()
        items = node.items() if isinstance(node, dict) else enumerate(node)
        for key, value in items:
            where = [*path, key]
            if isinstance(node, dict) and not isinstance(key, str):
                got = f"{type(key).__name__} {short(repr(key), 40)}"
                raise ConfigError(f"keys must be text, got {got}", key_path=_key_path(where))
            if isinstance(value, (dict, list)):
                todo.append((where, value))
            elif isinstance(value, datetime.date):  # YAML reads 2026-10-21 as a date
                raise ConfigError(
                    f'YAML read {value.isoformat()} as a date; quote it ("{value.isoformat()}") '
                    "to mean the text, e.g. an API version",
                    key_path=_key_path(where),
                )
            elif not isinstance(value, _JSON_LEAVES):
                got = f"{type(value).__name__} {short(repr(value), 40)}"
                raise ConfigError(f"not a JSON value: {got}", key_path=_key_path(where))


def validate_raw(raw: Any) -> None:
    """Validate a raw recipe mapping against the shipped JSON Schema.

    Raises:
        ConfigError: naming the first offending key path (the deepest, most specific error).
    """
    if not isinstance(raw, dict):
        raise ConfigError("a recipe must be a YAML mapping", key_path="<root>")
    _check_json_data(raw)
    validator = jsonschema.Draft202012Validator(shipped_schema())
    errors = list(validator.iter_errors(raw))
    if errors:
        best = jsonschema.exceptions.best_match(errors, key=_relevance)
        # Descend into anyOf branches (optional sections) for the most precise message.
        while best.context:
            best = jsonschema.exceptions.best_match(_meant_branch(best), key=_relevance)
        raise _format_error(_unknown_key_first(best, errors))


def _meant_branch(err: jsonschema.ValidationError) -> list[jsonschema.ValidationError]:
    """The errors of the ``anyOf`` branches meant for the value: a branch that refused
    the value's type (``null`` for a mapping) explains nothing about a misspelt key."""
    context = list(err.context or [])
    refused = {
        e.relative_schema_path[0]
        for e in context
        if e.validator == "type" and not e.relative_path and e.relative_schema_path
    }
    meant = [
        e for e in context if e.relative_schema_path and e.relative_schema_path[0] not in refused
    ]
    return meant or context


def _unknown_key_first(
    best: jsonschema.ValidationError, errors: list[jsonschema.ValidationError]
) -> jsonschema.ValidationError:
    """A missing required key beside an unknown one is most likely that key misspelt:
    report the unknown key, whose message names the required one."""
    if best.validator != "required":
        return best
    siblings = [best.parent.context or []] if best.parent is not None else [errors]
    for e in siblings[0]:
        if e.validator == "additionalProperties" and list(e.absolute_path) == list(
            best.absolute_path
        ):
            return e
    return best


def _parse_override(item: str) -> tuple[list[str], Any]:
    if "=" not in item:
        message = f"--set expects key.path=value, got {short(item, 80)!r}"
        raise ConfigError(message, key_path="--set")
    key, _, value = item.partition("=")
    parts = [p for p in key.strip().split(".") if p]
    if not parts:
        raise ConfigError(f"--set has an empty key in {short(item, 80)!r}", key_path="--set")
    parsed = parse_yaml(value, "value", key_path=_key_path(parts)) if value.strip() else ""
    return parts, parsed


def _is_index(part: str) -> bool:
    # str.isdigit() is true for "²", which int() refuses: ASCII digits only.
    return part.isascii() and part.isdigit()


def apply_overrides(raw: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``--set key.path=value`` items (values parsed as YAML) to a raw recipe.

    List items are addressed by index (``llm.endpoints.0.base_url``). Intermediate
    mappings are created as needed; whether the key is allowed is the schema's call.
    """
    for item in overrides:
        parts, value = _parse_override(item)
        node: Any = raw
        for i, part in enumerate(parts[:-1]):
            where = _key_path(parts[: i + 1])
            if isinstance(node, list):
                if not _is_index(part) or int(part) >= len(node):
                    raise ConfigError("no such list index", key_path=where)
                node = node[int(part)]
            elif isinstance(node, dict):
                if node.get(part) is None:
                    node[part] = {}
                node = node[part]
            else:
                raise ConfigError("cannot set a key inside a scalar", key_path=where)
        last = parts[-1]
        if isinstance(node, list):
            if not _is_index(last) or int(last) >= len(node):
                raise ConfigError("no such list index", key_path=_key_path(parts))
            node[int(last)] = value
        elif isinstance(node, dict):
            node[last] = value
        else:
            raise ConfigError("cannot set a key inside a scalar", key_path=_key_path(parts))
    return raw


def _check_domain(domain: DomainConfig, at: str) -> None:
    """A text-action domain (``grammar``) names no tools; ``compose`` needs a grammar."""
    if domain.grammar is not None and domain.tools is not None:
        raise ConfigError(
            "a text-action domain declares its actions in domain.grammar; remove domain.tools",
            key_path=f"{at}.tools",
        )
    if domain.compose is not None and domain.grammar is None:
        raise ConfigError(
            "composition rules compose text actions: set domain.grammar too",
            key_path=f"{at}.compose",
        )


def _semantic_checks(cfg: RecipeBase) -> None:
    _check_domain(cfg.domain, "domain")
    for i, part in enumerate(cfg.parts or []):
        _check_domain(part.domain, f"parts.{i}.domain")
    if cfg.domain.grammar is not None and cfg.pipeline == "envsim":
        raise ConfigError(
            "the envsim pipeline needs an executable world; a text-action domain has none",
            key_path="domain.grammar",
        )
    if cfg.domain.grammar is not None and cfg.amplify is not None:
        if cfg.amplify.grounding is not None:
            raise ConfigError(
                "grounding replays tool calls on an executable world; a text-action domain "
                "has none",
                key_path="amplify.grounding",
            )
        if cfg.amplify.system_prompt_format != "json":
            raise ConfigError(
                "a text-action domain has no tools to list in the system prompt",
                key_path="amplify.system_prompt_format",
            )
    if cfg.pipeline == "envsim":
        if cfg.envsim is None:
            raise ConfigError("the envsim pipeline needs an envsim section", key_path="envsim")
        if cfg.mixture is None:
            raise ConfigError("the envsim pipeline needs a mixture section", key_path="mixture")
        return
    if cfg.parts is not None:
        _check_parts(cfg)
    elif cfg.seeds is None:
        raise ConfigError("missing required value", key_path="seeds")
    elif cfg.seeds.path is None and cfg.seeds.hf_dataset is None:
        raise ConfigError("set seeds.path or seeds.hf_dataset", key_path="seeds")
    if cfg.pipeline == "amplify":
        if cfg.llm is None:
            raise ConfigError("the amplify pipeline needs an llm section", key_path="llm")
        if cfg.amplify is None:
            raise ConfigError("the amplify pipeline needs an amplify section", key_path="amplify")
    if cfg.llm is not None and cfg.llm.transport is not None:
        _check_transport(cfg.llm)
    if cfg.llm is not None and cfg.llm.per_actor_concurrency > cfg.llm.concurrency:
        raise ConfigError(
            f"per-actor limit {cfg.llm.per_actor_concurrency} exceeds the global "
            f"limit {cfg.llm.concurrency}",
            key_path="llm.per_actor_concurrency",
        )


def _check_parts(cfg: RecipeBase) -> None:
    """A mixed recipe: an amplify recipe whose seeds, domains and quotas are its parts."""
    if cfg.pipeline != "amplify":
        raise ConfigError("parts need the amplify pipeline", key_path="parts")
    if cfg.seeds is not None:
        raise ConfigError("a recipe with parts names its seeds in each part", key_path="seeds")
    if cfg.mixture is not None:
        raise ConfigError("a recipe with parts selects by its quotas", key_path="mixture")
    assert cfg.parts is not None
    labels = [p.label or p.domain.name for p in cfg.parts]
    for i, label in enumerate(labels):
        if label in labels[:i]:
            raise ConfigError(f"label {label!r} is used twice", key_path=f"parts.{i}")
    for i, part in enumerate(cfg.parts):
        if part.seeds.path is None and part.seeds.hf_dataset is None:
            raise ConfigError("set seeds.path or seeds.hf_dataset", key_path=f"parts.{i}.seeds")
    total = sum(p.quota for p in cfg.parts)
    if cfg.amplify is not None and cfg.amplify.target != total:
        raise ConfigError(
            f"amplify.target ({cfg.amplify.target}) must equal the sum of the parts' quotas "
            f"({total})",
            key_path="amplify.target",
        )


def _check_transport(llm: LLMConfig) -> None:
    """``llm.transport`` (deprecated) must not contradict ``llm.backend``."""
    if "backend" in llm.model_fields_set and llm.backend != llm.transport:
        raise ConfigError(
            f"llm.transport ({llm.transport}) contradicts llm.backend ({llm.backend}); "
            "llm.transport is deprecated: delete it and keep llm.backend",
            key_path="llm.transport",
        )


def _migrate_transport(llm: LLMConfig) -> None:
    """``llm.transport`` (before issue 9) still chooses the backend, with a warning."""
    assert llm.transport is not None
    log.warning(
        "llm.transport is deprecated; write `backend: %s` in the recipe's llm section instead",
        llm.transport,
    )
    llm.backend = llm.transport


def _input_path(raw: Any, loc: tuple[Any, ...], *, missing: bool) -> str:
    """The key path of a pydantic error location in the raw recipe.

    Pydantic's locations name union branches (``list[str]``) and dict keys
    (``[key]``) that are no keys of the input; only steps found in ``raw`` are
    kept, plus the last one of a missing value.
    """
    parts: list[Any] = []
    node = raw
    for step in loc:
        if isinstance(node, dict):
            found = step in node
            # The input's own key: pydantic reports a YAML key `false` as 0 (False == 0).
            step = next((k for k in node if k == step), step)
        else:
            found = isinstance(node, list) and isinstance(step, int) and 0 <= step < len(node)
        if found:
            node = node[step]
            parts.append(step)
    if missing and loc:
        parts.append(loc[-1])
    return _key_path(parts) or "<root>"


def load_recipe(path: str | Path, overrides: list[str] | None = None) -> Recipe:
    """Read, override, validate, type and resolve a recipe.

    Returns:
        The recipe as its kind (``CurateRecipe``, ``AmplifyRecipe``, ``EnvsimRecipe`` or
        ``MixRecipe``), every path in it absolute, every default applied.

    Raises:
        ConfigError: unreadable YAML, schema violation (with key path) or an
            inconsistent combination of sections.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read recipe {path}: {exc.strerror}", key_path="recipe") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(f"recipe {path} is not UTF-8 text: {exc}", key_path="recipe") from exc
    raw = parse_yaml(text, f"recipe {path}", key_path="recipe")
    if raw is None:
        raw = {}
    if isinstance(raw, dict):
        raw = apply_overrides(raw, overrides or [])
    cfg = recipe_from_data(raw, path.resolve().parent)
    cfg._source = path.resolve()
    return cfg


def recipe_from_data(raw: Any, base_dir: Path) -> Recipe:
    """A recipe from its raw data (a parsed YAML mapping), checked, typed and with its
    paths resolved against ``base_dir`` (what ``load_recipe`` does after reading)."""
    validate_raw(raw)
    _semantic_checks(_typed(RecipeBase, raw))
    cfg: Recipe = _typed(_RECIPE, raw)
    if cfg.llm is not None and cfg.llm.transport is not None:
        _migrate_transport(cfg.llm)
    resolve_paths(cfg, base_dir)
    return cfg


def _typed(model: Any, raw: Any) -> Any:
    """``raw`` validated as ``model`` (a model or a TypeAdapter); a pydantic error the
    schema did not catch still names its key path in the input."""
    try:
        if isinstance(model, TypeAdapter):
            return model.validate_python(raw)
        return model.model_validate(raw)
    except PydanticValidationError as exc:
        first = exc.errors()[0]
        key = _input_path(raw, first["loc"], missing=first["type"] == "missing")
        raise ConfigError(first["msg"], key_path=key) from exc


def config_hash(cfg: RecipeBase) -> str:
    """Hash of everything that changes the output (all recipe values, not the output dir),
    as written: the same recipe file hashes the same wherever the checkout is."""
    data = cfg.as_written()
    data.get("output", {}).pop("dir", None)
    return hashlib.sha256(canonical_json(data).encode()).hexdigest()[:16]
