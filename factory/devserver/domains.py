"""What the development server knows about the registered domains, all of it derived from
their data: no domain ships code for the devserver.

Why derived: the devserver must answer the prompts of any executable domain, one installed
from another package included, the moment its plug-in is registered. What it needs is in
the plug-in's parts it has anyway:

* **which domain a state belongs to**: the first registered domain whose environment builds
  a world over the state (its tables are there) and knows the tools asked about;
* **tools** and their kinds (``x-kind``): the domain's pack;
* **id keys**, JSON keys whose values are ids though the key does not say so
  (``reservations``, ``flight_number``, ``return_items``): read off a generated world, where
  an id is a table's key or the value of an ``id``/``*_id`` field, and a key whose every
  string value is such an id is an id key;
* **enum values**, what a drifting simulator swaps among (``status``, ``cabin``): the
  parameter enums of the pack's tools, plus the keys of a generated world that take a few
  short words over many records;
* **places**, codes renamed together with their names (an airport and its city): the one
  optional datum a domain may state (the plug-in's ``places``), since nothing in a world
  pairs a code with a name.

Each fact is computed once per process (a world is generated once per domain, well under a
second for the shipped ones).
"""

from __future__ import annotations

import functools
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator, Mapping
from copy import deepcopy
from dataclasses import dataclass, field
from typing import Any

from factory.envs.base import Environment
from factory.envs.pack import domain_from_pack
from factory.envs.registry import (
    available_domains,
    generate_environment,
    get_environment,
    get_plugin,
)
from factory.errors import ConfigError

__all__ = [
    "DomainFacts",
    "Vocabulary",
    "derive_enums",
    "derive_id_keys",
    "enums",
    "facts",
    "leaves",
    "reset",
    "vocabulary",
    "world_over",
]

State = dict[str, Any]

#: A key is an enum when its strings take at most this many values ...
_ENUM_MAX_VALUES = 12
#: ... each of them a short phrase without digits, seen on at least this many records each.
_ENUM_MIN_REPEATS = 3
_ENUM_MAX_CHARS = 30


@dataclass(frozen=True)
class DomainFacts:
    """What the devserver derives about one domain."""

    name: str
    tools: tuple[dict[str, Any], ...] = ()  # the pack's specs, with x-kind
    enums: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    id_keys: frozenset[str] = frozenset()
    places: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Vocabulary:
    """The renamer's vocabulary over every registered domain (``factory.devserver.simulate``).

    ``places`` are the renaming targets (one code per name, in the domains' order),
    ``every_place`` adds the codes whose name an earlier code already has (renamed when
    seen, never chosen).
    """

    places: dict[str, str]
    every_place: dict[str, str]
    id_keys: frozenset[str]


def leaves(value: Any, key: str = "") -> Iterator[tuple[str, Any]]:
    """``(key, value)`` of every scalar in a JSON value; a list item takes its list's key."""
    if isinstance(value, dict):
        for k, v in value.items():
            yield from leaves(v, str(k))
    elif isinstance(value, list):
        for item in value:
            yield from leaves(item, key)
    else:
        yield key, value


def _is_id_key(key: str) -> bool:
    return key == "id" or key.endswith(("_id", "_ids"))


def _ids(state: State) -> set[str]:
    found: set[str] = set()
    for table in state.values():
        if isinstance(table, dict):
            found.update(k for k in table if isinstance(k, str))
    found.update(v for k, v in leaves(state) if _is_id_key(k) and isinstance(v, str))
    return found


def derive_id_keys(state: State) -> frozenset[str]:
    """Keys (besides ``id``, ``*_id``, ``*_ids``) whose every string value in ``state`` is an id."""
    ids = _ids(state)
    verdict: dict[str, bool] = {}
    for key, value in leaves(state):
        if not isinstance(value, str) or _is_id_key(key) or not key:
            continue
        verdict[key] = verdict.get(key, True) and value in ids
    return frozenset(k for k, is_id in verdict.items() if is_id)


def derive_enums(
    state: State, tools: Iterable[Mapping[str, Any]] = ()
) -> dict[str, tuple[str, ...]]:
    """Per key, the few words it takes over ``state`` and the enums of ``tools``' parameters."""
    seen: dict[str, Counter[str]] = defaultdict(Counter)
    for key, value in leaves(state):
        if isinstance(value, str) and key and not _is_id_key(key):
            seen[key][value] += 1
    out: dict[str, tuple[str, ...]] = {}
    for key, counts in seen.items():
        words = [
            v for v in counts if v and len(v) <= _ENUM_MAX_CHARS and not any(c.isdigit() for c in v)
        ]
        if (
            2 <= len(counts) <= _ENUM_MAX_VALUES
            and len(words) == len(counts)
            and min(counts.values()) >= _ENUM_MIN_REPEATS
        ):
            out[key] = tuple(sorted(counts))
    for tool in tools:
        for key, schema in _properties(tool.get("parameters")):
            values = schema.get("enum")
            if isinstance(values, list) and all(isinstance(v, str) for v in values):
                merged = (*out.get(key, ()), *(v for v in values if v not in out.get(key, ())))
                out[key] = merged
    return out


def _properties(schema: Any) -> Iterator[tuple[str, dict[str, Any]]]:
    """``(name, schema)`` of every named property of a JSON Schema, nested ones included."""
    if not isinstance(schema, dict):
        return
    for name, sub in (schema.get("properties") or {}).items():
        if isinstance(sub, dict):
            yield name, sub
            yield from _properties(sub)
    items = schema.get("items")
    if isinstance(items, dict):
        yield from _properties(items)


@functools.cache
def facts(domain: str) -> DomainFacts:
    """The facts of a registered domain (empty parts where it lacks the data)."""
    plugin = get_plugin(domain)
    tools: list[dict[str, Any]] = []
    if plugin.pack is not None:
        tools = domain_from_pack(domain, plugin.pack).tools
    world: State = {}
    if plugin.environment is not None:
        try:
            world = generate_environment(domain, 0).state
        except (ConfigError, TypeError, ValueError, NotImplementedError):
            world = {}  # a domain without a generator: its tools' enums only
    return DomainFacts(
        name=domain,
        tools=tuple(tools),
        enums=derive_enums(world, tools),
        id_keys=derive_id_keys(world),
        places=dict(plugin.places),
    )


def _loaded() -> Iterator[DomainFacts]:
    """The facts of every registered domain whose plug-in loads, in name order (a broken
    plug-in is reported when a recipe names it, and must not take the server down)."""
    for domain in available_domains():
        try:
            yield facts(domain)
        except ConfigError:
            continue


@functools.cache
def vocabulary() -> Vocabulary:
    """Places and id keys of every registered domain, merged in name order."""
    places: dict[str, str] = {}
    every: dict[str, str] = {}
    id_keys: set[str] = {"id"}
    for known in _loaded():
        id_keys |= known.id_keys
        for code, name in known.places.items():
            every.setdefault(code, name)
            if code not in places and name not in places.values():
                places[code] = name
    return Vocabulary(places, every, frozenset(id_keys))


@functools.cache
def enums() -> dict[str, tuple[str, ...]]:
    """Enum values of every registered domain, merged per key in name order."""
    merged: dict[str, tuple[str, ...]] = {}
    for known in _loaded():
        for key, values in known.enums.items():
            have = merged.get(key, ())
            merged[key] = (*have, *(v for v in values if v not in have))
    return merged


def reset() -> None:
    """Forget what was derived (tests that register or replace a domain)."""
    facts.cache_clear()
    vocabulary.cache_clear()
    enums.cache_clear()


def world_over(state: State, tools: Iterable[str] = ()) -> tuple[str, Environment] | None:
    """``(domain, world over a copy of state)`` of the domain the state belongs to, or None.

    The first registered domain (by name) whose environment builds over the state and
    knows every tool of ``tools``; without such a domain, the first whose environment
    builds at all.
    """
    wanted = set(tools)
    fallback: tuple[str, Environment] | None = None
    for domain in available_domains("environment"):
        try:
            env = get_environment(domain, state=deepcopy(state))
        except (ConfigError, TypeError, ValueError, KeyError, AttributeError):
            continue
        if wanted <= set(env.tool_names):
            return domain, env
        fallback = fallback or (domain, env)
    return fallback
