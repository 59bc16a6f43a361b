"""Per-stage settings, resolved once from the recipe (the idea of Ray's ``resolve_stage_config``).

Why: the judge's model (``prefilter.model or llm.model``), a stage's price tier
(a batch API bills half), its request slots per actor and its cache used to be
worked out again wherever a stage, the plan, the budget check or the job needed
them. ``llm_stages(cfg)`` does it in one place and hands each LLM stage its
``LLMStageSettings``; nothing downstream reads those keys from the recipe again.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from factory.recipe import LLMConfig, Recipe
    from factory.llm.pricing import Price

__all__ = ["LLMStageSettings", "cache_location", "llm_stages", "per_actor_concurrency"]


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

    @property
    def max_output_tokens(self) -> int | None:
        value = self.sampling.get("max_completion_tokens") or self.sampling.get("max_tokens")
        return int(value) if value else None


def per_actor_concurrency(cfg: Recipe) -> int:
    """Per-actor request slots such that all actors together respect ``llm.concurrency``."""
    assert cfg.llm is not None
    return max(
        1, min(cfg.llm.per_actor_concurrency, math.ceil(cfg.llm.concurrency / cfg.ray.actors))
    )


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

    if cfg.llm is None:
        return {}
    prices = PriceTable.from_config({k: v.model_dump() for k, v in cfg.prices.items()})
    batched = get_backend(cfg.llm.backend).batched
    models = {"amplify": cfg.llm.model}
    if cfg.prefilter.enabled:
        models = {"prefilter": cfg.prefilter.model or cfg.llm.model, **models}
    out: dict[str, LLMStageSettings] = {}
    for stage, model in models.items():
        out[stage] = LLMStageSettings(
            stage=stage,
            model=model,
            sampling=dict(cfg.llm.sampling),
            llm=cfg.llm,
            slots=per_actor_concurrency(cfg),
            price=prices.lookup_batch(model) if batched else prices.lookup(model),
            batched=batched,
            cache=cache_location(cfg),
            out_dir=Path(cfg.output.dir),
            extra={"verdict_requests": cfg.prefilter.verdict_requests}
            if stage == "prefilter"
            else {},
        )
    return out
