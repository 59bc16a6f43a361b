"""Amplification: one LLM call writes one whole new trajectory from a reference.

Seeds are assigned to calls without replacement: the kept seeds are put in a
fixed order (sorted by id, then shuffled with ``amplify.seed``) and call ``k``
uses seed ``order[k % n]`` as variation ``k // n``. Every seed is used once
before any is used twice, and no request repeats an earlier one. The
assignment is a pure function of ``k`` alone, so a rerun or a resume makes the
same requests (all answered from the cache) whatever the timing of the calls
before, and no list of work items exists anywhere: the driver issues call
numbers as the observed yield requires (``factory.engine.jobs.amplify``).
"""

from __future__ import annotations

import json
import random
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from factory.config import RecipeConfig
from factory.core.trajectory import Trajectory
from factory.engine.prompts import PromptTemplate
from factory.engine.settings import LLMStageSettings
from factory.engine.stages.llm_stage import LLMStage, render
from factory.envs.pack import Domain, load_domain
from factory.envsim.grounding import render_scenario

if TYPE_CHECKING:
    from factory.config import GroundingConfig
    from factory.envsim.grounding import GroundingWorld

__all__ = [
    "AmplifyStage",
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


def amplify_template(cfg: RecipeConfig, domain: Domain) -> PromptTemplate:
    """The amplification template the recipe uses (the grounded one when grounding is on)."""
    assert cfg.amplify is not None
    if cfg.amplify.grounding is not None:
        path, key = cfg.amplify.grounding.prompt, "amplify.grounding.prompt"
    else:
        path, key = cfg.amplify.prompt, "amplify.prompt"
    return PromptTemplate(cfg.resolve(path), domain, key_path=key)


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
    ):
        self.template = template
        self.world = world
        self.scenario_seed = scenario_seed
        self.seeds = {sid: Trajectory.from_json(rec) for sid, rec in seeds.items()}
        self.order = order
        self.setup(settings)

    async def aprocess(self, row: dict[str, Any]) -> dict[str, Any]:
        k = int(row["call_index"])
        seed_id, variation = assign(k, self.order)
        row.update(seed_id=seed_id, source=f"{seed_id}#{variation}")
        extra = {}
        if self.world is not None:  # the slice of the world this call must use
            scenario = self.world.scenario(k, self.scenario_seed)
            extra["scenario_json"] = render_scenario(scenario)
        prompt = self.template.render(self.seeds[seed_id], variation=variation, **extra)
        request = render(
            "amplify", self.model, self.sampling, prompt.messages, seed=seed_id, variation=variation
        )
        await self.call(row, request)
        return row


def build_amplify(
    cfg: RecipeConfig, settings: LLMStageSettings, seeds: dict[str, str], order: list[str]
) -> AmplifyStage:
    """Inside an actor: the amplification stage of ``cfg`` over the kept ``seeds``."""
    assert cfg.amplify is not None
    grounding = cfg.amplify.grounding
    return AmplifyStage(
        settings,
        amplify_template(cfg, load_domain(cfg)),
        seeds,
        order,
        world=grounding_world(grounding, cfg.domain.name) if grounding else None,
        scenario_seed=cfg.amplify.seed,
    )
