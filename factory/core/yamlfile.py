"""Strict YAML loading for every file the factory reads (recipes, rules, mixtures).

Why one helper: PyYAML fails on hostile text in more ways than ``YAMLError``
(``ValueError`` for an impossible date such as ``2024-13-45`` or an integer
longer than Python converts, ``RecursionError`` for deep nesting), and a
recursive alias (``&a [*a]``) loads as a cycle no later step (schema, hash,
JSON) can walk. Each of these must become one ``ConfigError`` naming the file
and, where PyYAML knows it, the line.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml

from factory.errors import ConfigError, short

__all__ = ["known_keys", "mapping_items", "parse_yaml", "read_yaml"]


def parse_yaml(text: str, what: str, *, key_path: str = "") -> Any:
    """``yaml.safe_load(text)``, every failure a ConfigError about ``what``.

    Raises:
        ConfigError: ``{what} is not valid YAML[ at line L, column C]: detail``.
    """
    try:
        value = yaml.safe_load(text)
        json.dumps(value, default=str, skipkeys=True)  # raises on a cycle
    except (yaml.YAMLError, ValueError, RecursionError) as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        detail = short(" ".join(str(exc).split()), 200)
        raise ConfigError(f"{what} is not valid YAML{where}: {detail}", key_path=key_path) from exc
    return value


def read_yaml(path: str | Path, what: str, *, key_path: str = "") -> Any:
    """Read and parse a YAML file (``what`` names it in messages, e.g. ``rules file``).

    Raises:
        ConfigError: the file cannot be read as UTF-8 text, or :func:`parse_yaml` fails.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read {what} {path}: {exc}", key_path=key_path) from exc
    return parse_yaml(text, f"{what} {path}", key_path=key_path)


def known_keys(data: Mapping[str, Any], allowed: tuple[str, ...], at: str) -> None:
    """Refuse a key of ``data`` outside ``allowed``: a typo must not silently disable a
    setting of a data file (grammar, composition rules).

    Raises:
        ConfigError: naming the key path (``at.key``) and the allowed keys.
    """
    for key in data:
        if key not in allowed:
            where = f"{at}.{key}" if at else str(key)
            raise ConfigError(f"unknown key (allowed here: {', '.join(allowed)})", key_path=where)


def mapping_items(
    raw: Any, at: str, allowed: tuple[str, ...], what: str
) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """``(key path, item)`` of a list of mappings, each checked for unknown keys.

    Raises:
        ConfigError: ``raw`` is not a list, an item is not a mapping (``what`` says what it
            must be), or an item has a key outside ``allowed``.
    """
    if not isinstance(raw, list):
        raise ConfigError(f"must be a list of {what}", key_path=at)
    for n, item in enumerate(raw):
        where = f"{at}[{n}]"
        if not isinstance(item, Mapping):
            raise ConfigError(f"must be {what}", key_path=where)
        known_keys(item, allowed, where)
        yield where, item
