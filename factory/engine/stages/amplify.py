"""Amplification: one LLM call writes one whole new trajectory from a reference.

Seeds are assigned to calls without replacement: the kept seeds are put in a
fixed order (sorted by id, then shuffled with ``amplify.seed``) and call ``k``
uses seed ``order[k % n]`` as variation ``k // n``. Every seed is used once
before any is used twice, and no request repeats an earlier one. The
assignment is a pure function of ``k`` alone, so a rerun or a resume makes the
same requests (all answered from the cache) whatever the timing of the calls
before, and no list of work items exists anywhere: the driver issues call
numbers as the observed yield requires (``factory.engine.jobs.amplify``).

A composition recipe (``domain.compose``, OfficeBench style) shows each call, beside
its reference, one-app seeds of other apps (``factory.core.compose.companions``, a
pure function of the call) as the template's ``companions_json``.
"""

from __future__ import annotations

import json
import random
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from factory.core.compose import CompositionRules, apps_used, companions
from factory.core.trajectory import Trajectory
from factory.engine.prompts import PromptTemplate
from factory.engine.settings import AmplifySettings, LLMStageSettings, PromptFile
from factory.engine.stages.llm_stage import LLMStage, render
from factory.envs.pack import Domain
from factory.envsim.grounding import render_scenario

if TYPE_CHECKING:
    from factory.envsim.grounding import GroundingWorld
    from factory.recipe import GroundingConfig

__all__ = [
    "AmplifyStage",
    "Companions",
    "amplify_template",
    "assign",
    "build_amplify",
    "grounding_world",
    "seed_order",
]


@lru_cache(maxsize=4)
def _world(domain: str, world_seed: int, sizes_json: str) -> GroundingWorld:
    from factory.envsim.grounding import GroundingWorld

    return GroundingWorld(domain, world_seed, json.loads(sizes_json) or None)


def grounding_world(grounding: GroundingConfig, domain: str) -> GroundingWorld:
    """The executable world of a recipe's domain, built once per process (amplify and
    postprocess run in the same actor and share it)."""
    return _world(domain, grounding.world_seed, json.dumps(grounding.world_sizes, sort_keys=True))


def seed_order(seed_ids: list[str], seed: int) -> list[str]:
    """The deterministic order in which seeds are used."""
    order = sorted(set(seed_ids))
    random.Random(seed).shuffle(order)
    return order


def assign(call_index: int, order: list[str]) -> tuple[str, int]:
    """(seed id, variation number) of call ``call_index``: round-robin over ``order``."""
    return order[call_index % len(order)], call_index // len(order)


def amplify_template(prompt: PromptFile, domain: Domain) -> PromptTemplate:
    """The amplification template (``settings.amplify_prompt``: the grounded one when
    grounding is on) over the domain."""
    return PromptTemplate(prompt.path, domain, key_path=prompt.key)


class Companions:
    """The one-app seeds of other apps a composition call shows beside its reference
    (``factory.core.compose.companions``: a pure function of the seed and the call)."""

    def __init__(
        self,
        rules: CompositionRules,
        template: PromptTemplate,
        seeds: dict[str, Trajectory],
        seed_apps: dict[str, list[str]],
        seed: int,
    ):
        self.rules, self.template, self.seeds = rules, template, seeds
        self.seed_apps, self.seed = seed_apps, seed

    @classmethod
    def of(
        cls, domain: Domain, template: PromptTemplate, seeds: dict[str, Trajectory], seed: int
    ) -> Companions | None:
        """The companions of a composition domain's calls; None for any other domain."""
        if domain.compose is None or domain.grammar is None:
            return None
        apps = {sid: apps_used(t, domain.grammar) for sid, t in seeds.items()}
        return cls(domain.compose, template, seeds, apps, seed)

    def picked(self, seed_id: str, call_index: int) -> list[str]:
        return companions(seed_id, self.seed_apps, self.rules, call_index, self.seed)

    def extra(self, seed_id: str, call_index: int) -> dict[str, str]:
        """The template variables of one call (``companions_json``)."""
        shown = ",\n".join(
            self.template.reference_json(self.seeds[c]) for c in self.picked(seed_id, call_index)
        )
        return {"companions_json": f"[\n{shown}\n]"}


class AmplifyStage(LLMStage):
    """Call ``k`` (``call_index``) -> one new trajectory from the seed ``assign`` gives it."""

    name = "amplify"
    requires = ("call_index",)

    def __init__(
        self,
        settings: LLMStageSettings,
        template: PromptTemplate,
        seeds: dict[str, str],
        order: list[str],
        *,
        world: GroundingWorld | None = None,
        scenario_seed: int = 0,
        domain: Domain | None = None,
    ):
        self.template = template
        self.world = world
        self.scenario_seed = scenario_seed
        self.seeds = {sid: Trajectory.from_json(rec) for sid, rec in seeds.items()}
        self.order = order
        self.companions = (
            Companions.of(domain, template, self.seeds, scenario_seed) if domain else None
        )
        self.setup(settings)

    async def aprocess(self, row: dict[str, Any]) -> dict[str, Any]:
        k = int(row["call_index"])
        seed_id, variation = assign(k, self.order)
        row.update(seed_id=seed_id, source=f"{seed_id}#{variation}")
        extra = {}
        if self.world is not None:  # the slice of the world this call must use
            scenario = self.world.scenario(k, self.scenario_seed)
            extra["scenario_json"] = render_scenario(scenario)
        if self.companions is not None:  # the other apps' seeds this call composes with
            extra.update(self.companions.extra(seed_id, k))
        prompt = self.template.render(self.seeds[seed_id], variation=variation, **extra)
        request = render(
            "amplify", self.model, self.sampling, prompt.messages, seed=seed_id, variation=variation
        )
        await self.call(row, request)
        return row


def build_amplify(
    settings: LLMStageSettings,
    stage: AmplifySettings,
    domain: Domain,
    seeds: dict[str, str],
    order: list[str],
) -> AmplifyStage:
    """Inside an actor: the amplification stage over the kept ``seeds`` (its settings and
    the domain the driver loaded)."""
    grounding = stage.grounding
    return AmplifyStage(
        settings,
        amplify_template(stage.prompt, domain),
        seeds,
        order,
        world=grounding_world(grounding, domain.name) if grounding else None,
        scenario_seed=stage.seed,
        domain=domain,
    )
