"""Per-stage settings, resolved once from the recipe (the idea of Ray's ``resolve_stage_config``).

Why: the judge's model (``prefilter.model or llm.model``), a stage's price tier
(a batch API bills half), its request slots per actor and its cache used to be
worked out again wherever a stage, the plan, the budget check or the job needed
them. ``llm_stages(cfg)`` does it in one place and hands each LLM stage its
``LLMStageSettings``; nothing downstream reads those keys from the recipe again.

The other stages get theirs the same way (``SeedCheckSettings``, ``AmplifySettings``,
``PostprocessSettings``, ``ExportSettings``): a stage spec sent to an actor carries
these small frozen values and the ``Domain`` the driver loaded, never the recipe, so
an actor neither resolves a path nor reads a pack.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from factory.llm.pricing import Price
    from factory.recipe import (
        AmplifyRecipe,
        DecontamConfig,
        GroundingConfig,
        LLMConfig,
        MixRecipe,
        NearDupConfig,
        Recipe,
    )

__all__ = [
    "AmplifySettings",
    "ExportSettings",
    "LLMStageSettings",
    "PostprocessSettings",
    "PromptFile",
    "QualitySettings",
    "SeedCheckSettings",
    "amplify_prompt",
    "amplify_settings",
    "cache_location",
    "export_settings",
    "llm_stages",
    "per_actor_concurrency",
    "postprocess_settings",
    "prefilter_prompt",
    "quality_settings",
    "seed_check_settings",
    "stage_models",
    "stage_prices",
]


@dataclass(frozen=True)
class PromptFile:
    """A prompt template of the recipe: its file (absolute: resolved when the recipe was
    loaded) and the recipe key that names it (what an error about it says)."""

    path: Path
    key: str


@dataclass(frozen=True)
class SeedCheckSettings:
    """The seed checks' settings (``seeds.tools_from_domain``, ``seeds.min_reward``,
    ``output.reasoning``)."""

    tools_from_domain: bool
    min_reward: float | None
    reasoning: Literal["keep", "strip"]


@dataclass(frozen=True)
class QualitySettings:
    """The quality filters a stage applies to its rows: decontamination (its benchmark
    files, read in the actor) with the ids it excludes, and near-duplicate signatures."""

    decontamination: DecontamConfig | None
    excluded_ids: tuple[str | int, ...]
    near_duplicates: NearDupConfig | None


@dataclass(frozen=True)
class ExportSettings:
    """The curate job's export: the reasoning policy and the quality filters."""

    reasoning: Literal["keep", "strip"]
    quality: QualitySettings


@dataclass(frozen=True)
class AmplifySettings:
    """The amplification call's settings besides its LLM's: the template, the seed of
    the seed order and of the grounded scenarios, and grounding."""

    prompt: PromptFile
    seed: int
    grounding: GroundingConfig | None


@dataclass(frozen=True)
class PostprocessSettings:
    """Post-processing of an amplified trajectory: the deployment system prompt's format,
    reasoning, grounding (mode, world, scenario seed) and the quality filters."""

    system_prompt_format: str
    reasoning: Literal["keep", "strip"]
    grounding: GroundingConfig | None
    seed: int
    quality: QualitySettings


@dataclass(frozen=True)
class LLMStageSettings:
    """What one LLM stage needs, typed.

    Attributes:
        stage: the stage's name (``prefilter``, ``amplify``): the request ids', the
            ledger's and the manifest's ``by_stage`` key.
        model: the model it calls.
        sampling: the recipe's sampling options.
        llm: the recipe's ``llm`` section (endpoints, backend, retries, deadlines).
        slots: requests one actor may have in flight (``llm.concurrency`` split over
            the actors, at most ``llm.per_actor_concurrency``).
        price: what the stage's backend bills per token (the Batch tier for a batched
            backend), or None when the model has no price.
        batched: the backend takes batches (a batch API).
        cache: the response cache's folder, or None (``cache.enabled: false``).
        out_dir: the run's output folder (a batched backend keeps its journal there).
        actors: the actors that each build the stage's backend: they share a provider's
            rate-limit budget (``factory.llm.pacer``).
    """

    stage: str
    model: str
    sampling: dict[str, Any]
    llm: LLMConfig
    slots: int
    price: Price | None
    batched: bool
    cache: str | None
    out_dir: Path
    extra: dict[str, Any] = field(default_factory=dict)
    actors: int = 1

    @property
    def max_output_tokens(self) -> int | None:
        value = self.sampling.get("max_completion_tokens") or self.sampling.get("max_tokens")
        return int(value) if value else None


def per_actor_concurrency(cfg: AmplifyRecipe | MixRecipe) -> int:
    """Per-actor request slots such that all actors together respect ``llm.concurrency``."""
    return _slots(cfg.llm, cfg.ray.actors)


def _slots(llm: LLMConfig, actors: int) -> int:
    return max(1, min(llm.per_actor_concurrency, math.ceil(llm.concurrency / actors)))


def cache_location(cfg: Recipe) -> str | None:
    """The run's response cache folder (default ``OUTPUT/cache``), or None when disabled."""
    if not cfg.cache.enabled:
        return None
    return cfg.cache.path or str(Path(cfg.output.dir) / "cache")


def llm_stages(cfg: Recipe) -> dict[str, LLMStageSettings]:
    """The recipe's LLM stages by name, each with its resolved settings (empty without
    an ``llm`` section). The judge is listed only when the pre-filter is on."""
    from factory.llm.backends import get_backend
    from factory.llm.pricing import PriceTable

    llm = cfg.llm
    if llm is None:
        return {}
    prices = PriceTable.from_config({k: v.model_dump() for k, v in cfg.prices.items()})
    batched = get_backend(llm.backend).batched
    out: dict[str, LLMStageSettings] = {}
    for stage, model in stage_models(cfg).items():
        out[stage] = LLMStageSettings(
            stage=stage,
            model=model,
            sampling=dict(llm.sampling),
            llm=llm,
            slots=_slots(llm, cfg.ray.actors),
            price=prices.lookup_batch(model) if batched else prices.lookup(model),
            batched=batched,
            cache=cache_location(cfg),
            out_dir=Path(cfg.output.dir),
            actors=cfg.ray.actors,
            extra={"verdict_requests": cfg.prefilter.verdict_requests}
            if stage == "prefilter"
            else {},
        )
    return out


def stage_models(cfg: Recipe) -> dict[str, str]:
    """The model of each LLM stage, in order (the judge only when the pre-filter is on;
    empty without an ``llm`` section). Needs no backend: the plan names the models of a
    backend this installation lacks."""
    llm = cfg.llm
    if llm is None:
        return {}
    models = {"amplify": llm.model}
    if cfg.prefilter.enabled:
        models = {"prefilter": cfg.prefilter.model or llm.model, **models}
    return models


def stage_prices(cfg: Recipe) -> dict[str, tuple[Price | None, Price | None]]:
    """Per LLM stage: the price it pays per token (a batch API's when the backend is
    batched) and, when batched, the online price of the same model (what batching saved
    is measured against; None when online). What the run's ledger accounts with."""
    from factory.llm.pricing import PriceTable

    table = PriceTable.from_config({k: v.model_dump() for k, v in cfg.prices.items()})
    return {
        stage: (s.price, table.lookup(s.model) if s.batched else None)
        for stage, s in llm_stages(cfg).items()
    }


def seed_check_settings(cfg: Recipe) -> SeedCheckSettings:
    """The seed checks of a recipe that reads seeds (``seeds`` is set)."""
    seeds = cfg.seed_sections()[0]
    return SeedCheckSettings(seeds.tools_from_domain, seeds.min_reward, cfg.output.reasoning)


def quality_settings(cfg: Recipe) -> QualitySettings:
    mixture = cfg.mixture
    return QualitySettings(
        cfg.decontamination,
        tuple(mixture.exclude_task_ids) if mixture is not None else (),
        cfg.near_duplicates,
    )


def export_settings(cfg: Recipe) -> ExportSettings:
    return ExportSettings(cfg.output.reasoning, quality_settings(cfg))


def prefilter_prompt(cfg: Recipe) -> PromptFile:
    return PromptFile(Path(cfg.prefilter.prompt), "prefilter.prompt")


def amplify_prompt(cfg: AmplifyRecipe) -> PromptFile:
    """The amplification template the recipe uses (the grounded one when grounding is on)."""
    grounding = cfg.amplify.grounding
    if grounding is not None:
        return PromptFile(Path(grounding.prompt), "amplify.grounding.prompt")
    return PromptFile(Path(cfg.amplify.prompt), "amplify.prompt")


def amplify_settings(cfg: AmplifyRecipe) -> AmplifySettings:
    return AmplifySettings(amplify_prompt(cfg), cfg.amplify.seed, cfg.amplify.grounding)


def postprocess_settings(cfg: AmplifyRecipe) -> PostprocessSettings:
    return PostprocessSettings(
        cfg.amplify.system_prompt_format,
        cfg.output.reasoning,
        cfg.amplify.grounding,
        cfg.amplify.seed,
        quality_settings(cfg),
    )
