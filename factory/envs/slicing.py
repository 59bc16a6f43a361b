"""Slices: the part of a world one call reads or writes, shown to a simulator.

Each domain knows which objects a call touches (``factory/envs/<domain>/slices.py``
``slice_for``); trimming an object's big mapping to the keys that matter (a flight's
dates, a product's variants) and projecting a later state onto a slice's shape are the
same for every domain and written once here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from copy import deepcopy
from typing import Any

__all__ = ["project_like", "trim"]


def trim(entity: Any, field: str, keys: Iterable[str]) -> Any:
    """A deep copy of ``entity`` whose mapping ``field`` keeps only ``keys``."""
    inner = entity.get(field) if isinstance(entity, dict) else None
    if not isinstance(inner, dict):
        return deepcopy(entity)
    keep = set(keys)
    out = {k: deepcopy(v) for k, v in entity.items() if k != field}
    out[field] = {k: deepcopy(v) for k, v in inner.items() if k in keep}
    return out


def project_like(
    state: dict[str, Any], like: dict[str, Any], trimmed: Mapping[str, str]
) -> dict[str, Any]:
    """The objects of ``state`` that ``like`` (a slice) holds, trimmed the same way
    (``trimmed``: table -> the mapping field its slices keep only some keys of).

    Ids of ``like`` missing from ``state`` are left out; the result is a deep copy.
    """
    out: dict[str, Any] = {}
    for table, entries in like.items():
        source = state.get(table)
        if not isinstance(entries, dict) or not isinstance(source, dict):
            out[table] = deepcopy(source)
            continue
        field = trimmed.get(table)
        out[table] = {}
        for key, shape in entries.items():
            if key not in source:
                continue
            if field and isinstance(shape, dict) and isinstance(shape.get(field), dict):
                out[table][key] = trim(source[key], field, shape[field])
            else:
                out[table][key] = deepcopy(source[key])
    return out
