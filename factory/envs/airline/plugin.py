"""The airline domain as a plug-in: what the engine may ask of it, in one place.

Registered through the ``factory.domains`` entry point group in
``pyproject.toml`` (``airline = "factory.envs.airline.plugin:plugin"``), the
same hook a domain in another package uses; importing this module registers
nothing. The parts are built from the airline modules beside it; heavy ones
import lazily so loading the plug-in stays cheap.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import Any

from factory.envs.base import Environment
from factory.envs.plugin import DataPack, DevserverHooks, DomainPlugin, EpisodeSampling, Slicing

__all__ = ["NAME", "plugin"]

NAME = "airline"
#: The shipped pack: ``prompts/airline/`` and ``filters/airline.yaml`` beside the package.
_ROOT = Path(__file__).resolve().parents[3]


def _environment(**kw: Any) -> Environment:
    from factory.envs.airline import AirlineEnv

    return AirlineEnv.create(**kw)


def _slicing() -> Slicing:
    from factory.envs.airline import AirlineEnv
    from factory.envs.airline.slices import project, slice_for

    def world(state: dict[str, Any], like: Environment | None) -> Environment:
        validate = getattr(like, "validate_arguments", True)
        # copy(): the fork deep-copies what it writes, so ``state`` itself stays untouched.
        return AirlineEnv(state, validate_arguments=validate).copy()

    return Slicing(slice_for=slice_for, project=lambda s, like: project(s, like=like), world=world)


def _tool_functions() -> Mapping[str, Callable[..., Any]]:
    from factory.envs.airline.tools import TOOLS

    return TOOLS


def _grounding(env: Environment) -> Any:
    from factory.envs.airline.scenarios import AirlineScenarios

    return AirlineScenarios(env)


def _play(state: dict[str, Any], rng: Any, reference_tools: Collection[str]) -> Any:
    from factory.envs.airline.devserver import grounded_trajectory

    return grounded_trajectory(state, rng, reference_tools=reference_tools)


def plugin() -> DomainPlugin:
    """The airline plug-in (the entry point's target)."""
    from factory.envs.airline import devserver, sampler
    from factory.envs.airline.world import generate_world

    return DomainPlugin(
        name=NAME,
        pack=DataPack(
            tools=_ROOT / "prompts" / NAME / "tools.json",
            policy=_ROOT / "prompts" / NAME / "policy.md",
            rules=_ROOT / "filters" / f"{NAME}.yaml",
        ),
        environment=_environment,
        world_sizes=frozenset(inspect.signature(generate_world).parameters) - {"seed"},
        slicing=_slicing(),
        tool_functions=_tool_functions,
        sampler=EpisodeSampling(
            scenarios=sampler.SCENARIOS,
            system=sampler.DEFAULT_SYSTEM,
            default_tools=sampler.default_tools,
            sample_episode=sampler.sample_episode,
        ),
        grounding=_grounding,
        # tau-bench's user addresses say "state" where its recorded trajectories say "province".
        fidelity_renames={"province": "state"},
        devserver=DevserverHooks(
            read_state=devserver.read_state,
            play=_play,
            observation_enums=devserver.OBSERVATION_ENUMS,
            places=devserver.PLACES,
            source_only_places=devserver.SOURCE_ONLY_PLACES,
            id_keys=devserver.ID_KEYS,
        ),
    )
