"""The retail domain as a plug-in: what the engine may ask of it, in one place.

Registered through the ``factory.domains`` entry point group in
``pyproject.toml`` (``retail = "factory.envs.retail.plugin:plugin"``), the
same hook the airline and any third-party domain use; importing this module
registers nothing. Heavy parts import lazily so loading the plug-in stays cheap.

The data pack (``prompts/retail/``, ``filters/retail.yaml``) ships with the factory
(``factory.packs``).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any

from factory.envs.base import Environment
from factory.envs.plugin import DataPack, DomainPlugin, EpisodeSampling, Slicing

__all__ = ["NAME", "plugin"]

NAME = "retail"


def _environment(**kw: Any) -> Environment:
    from factory.envs.retail import RetailEnv

    return RetailEnv.create(**kw)


def _slicing() -> Slicing:
    from factory.envs.retail import RetailEnv
    from factory.envs.retail.slices import project, slice_for

    def world(state: dict[str, Any], like: Environment | None) -> Environment:
        validate = getattr(like, "validate_arguments", True)
        # copy(): the fork deep-copies what it writes, so ``state`` itself stays untouched.
        return RetailEnv(state, validate_arguments=validate).copy()

    return Slicing(slice_for=slice_for, project=lambda s, like: project(s, like=like), world=world)


def _grounding(env: Environment) -> Any:
    from factory.envs.retail.scenarios import RetailScenarios

    return RetailScenarios(env)


def _tool_functions() -> Mapping[str, Callable[..., Any]]:
    from factory.envs.retail.tools import TOOLS

    return TOOLS


def plugin() -> DomainPlugin:
    """The retail plug-in (the entry point's target)."""
    from factory.envs.retail import sampler
    from factory.envs.retail.world import generate_world

    return DomainPlugin(
        name=NAME,
        pack=DataPack.shipped(NAME),
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
    )
