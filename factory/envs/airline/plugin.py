"""The airline domain as a plug-in: what the engine may ask of it, in one place.

Registered through the ``factory.domains`` entry point group in
``pyproject.toml`` (``airline = "factory.envs.airline.plugin:plugin"``), the
same hook a domain in another package uses; importing this module registers
nothing. The parts are built from the airline modules beside it; heavy ones
import lazily so loading the plug-in stays cheap.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any

from factory.envs.base import Environment
from factory.envs.plugin import DataPack, DomainPlugin, EpisodeSampling, Slicing

__all__ = ["NAME", "plugin"]

NAME = "airline"


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


def simulator_facts(tool: str) -> str:
    """What no state slice shows about ``tool``: the airline's "now", new ids, the airports.

    Why: a booking's ``created_at`` is the domain's fixed current time, its id the
    first free one of a fixed list, and ``list_all_airports`` answers a table
    that lives in the code; without these lines a simulator would have to
    memorise them (issue 10: 1,958 of 6,230 rows were not derivable from their
    prompt). The slice of a booking shows every existing reservation among
    those ids, and the user's payment methods show the certificates, so the
    rules below decide the new ids from the prompt alone.
    """
    import json

    from factory.envs.airline.tools import (
        AIRPORTS,
        NEW_CERTIFICATE_IDS,
        NEW_RESERVATION_IDS,
        NOW,
    )

    first, second, last = NEW_RESERVATION_IDS
    lines = [f"- The current time is {NOW} (EST)."]
    if tool == "book_reservation":
        lines += [
            "- A new reservation's created_at is the current time.",
            f"- A new reservation's id is {first}; if {first} is already a reservation, "
            f"{second}; if both are, {last}.",
        ]
    elif tool == "send_certificate":
        lines.append(
            f"- A new certificate's id is the first of {', '.join(NEW_CERTIFICATE_IDS)} "
            "that is not among the user's payment methods."
        )
    elif tool == "list_all_airports":
        lines.append(f"- The airports (code: city), in this order: {json.dumps(AIRPORTS)}")
    return "\n".join(lines)


def plugin() -> DomainPlugin:
    """The airline plug-in (the entry point's target)."""
    from factory.envs.airline import sampler
    from factory.envs.airline.lookups import PLACES
    from factory.envs.airline.world import generate_world

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
        # tau-bench's user addresses say "state" where its recorded trajectories say "province".
        fidelity_renames={"province": "state"},
        places=PLACES,
        simulator_facts=simulator_facts,
    )
