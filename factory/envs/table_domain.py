"""A tau-bench-style domain's plug-in in a few lines: defaults for every part a table world
can give by itself.

Why: a domain written as a :class:`~factory.envs.tables.TableWorld` (tables keyed by id,
tools ``fn(state, **arguments) -> str``) already declares what most plug-in parts need.
:func:`table_plugin` builds the :class:`~factory.envs.plugin.DomainPlugin` from it, and a
domain states only what is its own (scenarios for the sampler, a slicing or grounding rule
it prefers to the default, a datum or two)::

    def plugin() -> DomainPlugin:
        return table_plugin("library", LibraryWorld, pack=DataPack.of_package(...),
                            sampler=sampler.SAMPLER)

The defaults, each replaceable:

* ``pack``: the pack the factory ships for the name (``prompts/NAME/``, ``filters/NAME.yaml``);
* ``environment`` and ``world_sizes``: the world's ``create`` and the size arguments of
  its ``generator``;
* ``tool_functions``: the world's ``tools``;
* ``slicing``: the records a call reads (:class:`RecordedSlicing`, exact for any table world),
  or the domain's own ``slice_for``/``project`` (:class:`SliceRules`);
* ``grounding``: one record of the first table and the records that mention it
  (:class:`SubjectScenarios`);
* ``sampler``: a :class:`~factory.envs.episode.ScenarioSampler` of the domain's scenarios.
"""

from __future__ import annotations

import inspect
import random
from collections.abc import Callable, Mapping
from copy import deepcopy
from typing import Any, Protocol

from factory.core.delta import same_json
from factory.envs.base import Environment
from factory.envs.episode import ScenarioSampler
from factory.envs.plugin import DataPack, DomainPlugin, EpisodeSampling, ScenarioSource, Slicing
from factory.envs.slicing import project_like
from factory.envs.tables import ALL, TableWorld
from factory.errors import ConfigError, short

__all__ = [
    "MAX_RELATED",
    "MAX_SCANNED",
    "RecordedSlicing",
    "SliceRules",
    "SubjectScenarios",
    "table_plugin",
]

State = dict[str, Any]

MAX_RELATED = 3  # records of each other table a default grounding scenario shows
MAX_SCANNED = 100  # a table a tool scans is shown whole up to this size


class SliceRules(Protocol):
    """A domain's own slicing (a module with these two functions will do)."""

    def slice_for(self, state: State, tool: str, arguments: Any) -> State:
        """The part of ``state`` the call reads or writes."""
        ...

    def project(self, state: State, *, like: State) -> State:
        """The objects of ``state`` that the slice ``like`` holds."""
        ...


class RecordedSlicing:
    """The default slicing of a table world: a call's slice is the records it touches.

    Exact for any tools (the guarantee ``factory.envsim.steps`` checks): the call runs on a
    fork that notes every record it reads (:meth:`TableWorld.reads`), and a table it scans
    is kept whole, so on the slice it reads the same records and answers the same.
    """

    def __init__(self, world: type[TableWorld]) -> None:
        self.world = world

    def slice_for(self, state: State, tool: str, arguments: Any) -> State:
        touched = self.world(state).reads(tool, arguments)
        out: State = {}
        for table in self.world.tables:
            keys = touched.get(table, set())
            records = state[table]
            out[table] = {k: deepcopy(v) for k, v in records.items() if ALL in keys or k in keys}
        return out

    def project(self, state: State, *, like: State) -> State:
        return project_like(state, like, {})


class SubjectScenarios:
    """The default grounding of a table world: one record of its first table (the subject,
    a user or member) and, of every other table, up to :data:`MAX_RELATED` records that
    mention it, with the records those mention; a table some tool scans (a search) is shown
    whole when it has at most :data:`MAX_SCANNED` records, so the search answers on the
    scenario as on the world (a bigger one is not: such a domain states its own grounding).

    Raises:
        ConfigError: the world's first table is empty.
    """

    def __init__(self, env: Environment) -> None:
        self.env = env
        state = env.state
        self._first = next(iter(state))
        self._subjects = sorted(state[self._first])
        if not self._subjects:
            raise ConfigError(f"the grounding world has no {self._first}", key_path="world_sizes")
        self._whole = {
            t for t in _scanned(env) if t != self._first and len(state[t]) <= MAX_SCANNED
        }

    def scenario(self, index: int, rng_seed: int) -> State:
        """The slice shown in the prompt of call ``index`` (same arguments, same slice)."""
        state = self.env.state
        rng = random.Random(f"grounding:{rng_seed}:{index}")
        subject = rng.choice(self._subjects)
        out: State = {self._first: {subject: deepcopy(state[self._first][subject])}}
        named = set(_strings(out[self._first][subject]))
        for table, records in state.items():
            if table == self._first or not isinstance(records, dict):
                continue
            theirs = [k for k, v in records.items() if subject in _strings(v) or k in named]
            if table in self._whole:
                theirs = list(records)
            elif len(theirs) > MAX_RELATED:
                theirs = sorted(rng.sample(theirs, MAX_RELATED), key=list(records).index)
            out[table] = {k: deepcopy(records[k]) for k in theirs}
            for k in theirs:
                named |= set(_strings(records[k]))
        for table, records in state.items():  # what the shown records name, one hop
            if table != self._first and isinstance(records, dict):
                for k in records:
                    if k in named and k not in out[table]:
                        out[table][k] = deepcopy(records[k])
        return out

    def mismatch(self, scenario: Mapping[str, Any]) -> str | None:
        """What differs between ``scenario`` and this world, or None."""
        state = self.env.state
        for table, records in scenario.items():
            for key, value in (records or {}).items():
                if not same_json((state.get(table) or {}).get(key), value):
                    return f"{table} {short(key, 40)} differs"
        return None

    def subject(self, scenario: Mapping[str, Any]) -> str | None:
        """Who the scenario is about: the record of its first table."""
        return next(iter(scenario.get(self._first) or {}), None)


def _scanned(env: Environment) -> set[str]:
    """Tables some tool of ``env`` reads whole (a search), probed with made-up arguments."""
    reads = getattr(env, "reads", None)
    schemas = getattr(env, "parameters", None)
    if reads is None or not isinstance(schemas, Mapping):
        return set()
    found: set[str] = set()
    for tool, schema in schemas.items():
        required = schema.get("required") or [] if isinstance(schema, dict) else []
        touched = reads(tool, {name: "?" for name in required})
        found |= {table for table, keys in touched.items() if ALL in keys}
    return found


def _strings(value: Any) -> list[str]:
    if isinstance(value, dict):
        return [s for v in value.values() for s in _strings(v)]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return [value] if isinstance(value, str) else []


def _world_sizes(world: type[TableWorld]) -> frozenset[str]:
    try:
        generator = world.generator_function()
    except NotImplementedError:
        return frozenset()
    return frozenset(inspect.signature(generator).parameters) - {"seed"}


def table_plugin(
    name: str,
    world: type[TableWorld],
    *,
    pack: DataPack | None = None,
    slices: SliceRules | None = None,
    sampler: ScenarioSampler[Any] | None = None,
    grounding: Callable[[Environment], ScenarioSource] | None = SubjectScenarios,
    fidelity_renames: Mapping[str, str] | None = None,
    places: Mapping[str, str] | None = None,
    simulator_facts: Callable[[str], str] | None = None,
) -> DomainPlugin:
    """The plug-in of the table world ``world`` (see the module for the defaults).

    Args:
        name: the domain's name (its entry point's name).
        world: the domain's ``TableWorld`` subclass.
        pack: its data pack; default the one the factory ships for ``name``, if any.
        slices: its own slicing rules; default :class:`RecordedSlicing`.
        sampler: its scenarios for the LLM-free sampler (the ``envsim`` job); none by default.
        grounding: its grounding scenarios; default :class:`SubjectScenarios` (None: none).
        fidelity_renames, places, simulator_facts: the plug-in's data of those names.
    """
    rules: SliceRules = slices if slices is not None else RecordedSlicing(world)

    def over(state: State, like: Environment | None) -> Environment:
        validate = getattr(like, "validate_arguments", True)
        # copy(): the fork deep-copies what it writes, so ``state`` itself stays untouched.
        return world(state, validate_arguments=validate).copy()

    return DomainPlugin(
        name=name,
        pack=pack if pack is not None else DataPack.shipped(name),
        environment=world.create,
        world_sizes=_world_sizes(world),
        slicing=Slicing(
            slice_for=rules.slice_for,
            project=lambda state, like: rules.project(state, like=like),
            world=over,
        ),
        tool_functions=lambda: world.tools,
        sampler=None
        if sampler is None
        else EpisodeSampling(
            scenarios=sampler.weights,
            system=sampler.system,
            default_tools=sampler.default_tools,
            sample_episode=sampler.sample_episode,
        ),
        grounding=grounding,
        fidelity_renames=dict(fidelity_renames or {}),
        places=dict(places or {}),
        simulator_facts=simulator_facts,
    )
