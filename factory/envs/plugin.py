"""What a domain plug-in may supply: one typed record with optional parts.

Why one record and not a module per hook: a domain is a unit a developer
writes (or installs) in one place, ``factory/envs/<domain>/`` or a package of
its own, and the engine asks it for parts by name. Every part but the name is
optional; the engine says which part is missing when a recipe needs it
(:func:`factory.envs.registry.get_plugin` with ``needs=``):

* ``pack``: tools.json, policy.md and rules YAML shipped with the domain
  (``factory.envs.pack``, when a recipe names no files);
* ``environment``: ``environment(**kw) -> Environment`` from ``db_dir=``,
  ``state=``, or ``seed=`` plus generator sizes (``get_environment``,
  fidelity, the devserver's simulator answers);
* ``world_sizes``: the generator size keys ``environment(seed=...)`` takes;
* ``slicing``: the part of a state one call reads or writes (``factory.envsim.steps``);
* ``tool_functions``: the Python functions behind the tools, for code(a)
  (``factory.envsim.steps``, ``factory.evaluate``);
* ``sampler``: LLM-free episodes on a world: scenarios, weights, default
  tools (``factory.envsim.sampler``);
* ``grounding``: the state slices grounded amplification prompts show
  (``factory.envsim.grounding``);
* ``fidelity_renames``: keys the database renamed since its reference
  trajectories were recorded (``factory.envsim.fidelity``);
* ``places``: codes renamed together with a name (an airport and its city) when the
  development server varies a reference; the one datum it cannot read off the
  domain's world and tools (``factory.devserver.domains`` derives the rest);
* ``simulator_facts``: ``simulator_facts(tool) -> text``, what a simulator of
  that tool must know that no state slice shows (the current time, the rule a
  tool follows to name a new object, a constant table), stated in every
  simulator prompt and training row so each output is derivable from its
  input (``factory.envsim.simulator``).

A domain with only a data pack needs no plug-in at all: a recipe that names
its files (``domain.tools``/``policy``/``rules``) runs the curate and amplify
pipelines with no Python.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from factory import packs
from factory.errors import ConfigError

if TYPE_CHECKING:
    from factory.core.trajectory import Trajectory
    from factory.envs.base import Environment

__all__ = [
    "PARTS",
    "DataPack",
    "DomainPlugin",
    "EpisodeSampling",
    "ScenarioSource",
    "Slicing",
]

State = dict[str, Any]


@dataclass(frozen=True)
class DataPack:
    """The files of a domain pack; a recipe's ``domain`` section may name others instead."""

    tools: Path
    policy: Path | None = None
    rules: Path | None = None

    @classmethod
    def shipped(cls, name: str) -> DataPack | None:
        """The pack of domain ``name`` the factory ships (``factory.packs``):
        ``prompts/NAME/tools.json``, ``prompts/NAME/policy.md`` and ``filters/NAME.yaml``,
        each where present; None without a tools file."""
        return cls._existing(
            packs.shipped(f"prompts/{name}/tools.json"),
            packs.shipped(f"prompts/{name}/policy.md"),
            packs.shipped(f"filters/{name}.yaml"),
        )

    @classmethod
    def of_package(
        cls, package: str, *, tools: str, policy: str | None = None, rules: str | None = None
    ) -> DataPack | None:
        """A pack a domain's own package ships as package data (``importlib.resources``:
        paths relative to ``package``); None without its tools file."""
        root = resources.files(package)
        if not isinstance(root, Path):
            raise ConfigError(f"package {package} is not installed as files", key_path="domain")
        return cls._existing(
            root / tools, root / policy if policy else None, root / rules if rules else None
        )

    @classmethod
    def _existing(cls, tools: Path, policy: Path | None, rules: Path | None) -> DataPack | None:
        if not tools.is_file():
            return None
        return cls(
            tools=tools,
            policy=policy if policy is not None and policy.is_file() else None,
            rules=rules if rules is not None and rules.is_file() else None,
        )


@dataclass(frozen=True)
class Slicing:
    """How to cut a state to one call, and run a call on such a cut.

    ``slice_for(state, tool, arguments)``: the part of ``state`` the call reads or writes.
    ``project(state, like)``: the objects of ``state`` that the slice ``like`` holds.
    ``world(state, like)``: an environment over a slice (the caller keeps ``state``
    unchanged); ``like`` is the environment the slice came from, or None.
    """

    slice_for: Callable[[State, str, Any], State]
    project: Callable[[State, State], State]
    world: Callable[[State, Environment | None], Environment]


class ScenarioSource(Protocol):
    """Slices of one world that grounded amplification prompts show (built once per actor)."""

    def scenario(self, index: int, rng_seed: int) -> State:
        """The slice shown in prompt ``index`` (same arguments, same slice)."""
        ...

    def mismatch(self, scenario: Mapping[str, Any]) -> str | None:
        """Why ``scenario`` does not come from this world, or None when it does."""
        ...

    def subject(self, scenario: Mapping[str, Any]) -> str | None:
        """The id of who the scenario is about (a user), recorded with the row."""
        ...


class EpisodeSampler(Protocol):
    """One LLM-free episode on a fresh fork of a world (see ``factory.envsim.sampler``)."""

    def __call__(
        self,
        env: Environment,
        *,
        rng: random.Random,
        env_id: str,
        invalid_share: float,
        violation_share: float,
        task_id: str | None,
        tools: list[dict[str, Any]] | None,
        system: str,
        scenarios: Mapping[str, float] | None,
    ) -> Trajectory: ...


@dataclass(frozen=True)
class EpisodeSampling:
    """The domain side of the programmatic sampler.

    ``scenarios``: default weights (a recipe may reweight the same names);
    ``system``: default system prompt; ``default_tools()``: bare tool specs with
    ``x-kind`` for episodes that get no pack tools; ``sample_episode``: plays one.
    """

    scenarios: Mapping[str, float]
    system: str
    default_tools: Callable[[], list[dict[str, Any]]]
    sample_episode: EpisodeSampler


@dataclass(frozen=True)
class DomainPlugin:
    """Everything the engine may ask of one domain; only ``name`` is required."""

    name: str
    pack: DataPack | None = None
    environment: Callable[..., Environment] | None = None
    world_sizes: frozenset[str] = frozenset()
    slicing: Slicing | None = None
    tool_functions: Callable[[], Mapping[str, Callable[..., Any]]] | None = None
    sampler: EpisodeSampling | None = None
    grounding: Callable[[Environment], ScenarioSource] | None = None
    fidelity_renames: Mapping[str, str] = field(default_factory=dict)
    #: code -> place name, in order; a code whose name an earlier code has is only renamed
    #: when seen, never chosen (so a name always renames with one code).
    places: Mapping[str, str] = field(default_factory=dict)
    simulator_facts: Callable[[str], str] | None = None

    def has(self, part: str) -> bool:
        """Whether the plug-in supplies ``part`` (a field name of :data:`PARTS`)."""
        if part not in PARTS:
            raise ValueError(f"unknown plug-in part {part!r}; parts: {', '.join(PARTS)}")
        return bool(getattr(self, part))


#: The optional parts a recipe or command may need, in declaration order.
PARTS: tuple[str, ...] = (
    "pack",
    "environment",
    "slicing",
    "tool_functions",
    "sampler",
    "grounding",
    "fidelity_renames",
    "places",
    "simulator_facts",
)
