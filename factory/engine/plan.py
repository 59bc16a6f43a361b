"""``--dry-run``: what a recipe would do and cost, without calling anything.

Seeds are read and checked for real (the same stage code as the run), so the
read/valid/rejected counts are exact. LLM calls and tokens are estimates:
calls from the target and the expected yield (``expected_yield``: the yield an
earlier run of the output folder measured, weighed as the run's own planner weighs
it, else the recipe's ``amplify.expected_yield``; the plan names which, since a
composition recipe that declared 0.8 and yielded 0.63 cost 27% more than planned,
issue 39); prompt tokens by
rendering the real prompts for the real seeds; completion tokens from the
size of the reference each call imitates. Cost comes with the chosen backend's
provider cache and batch API (``factory.llm.costs.estimate``): the static prefix of a
stage's prompt is cached as the backend's ``CacheTerms`` say (none below the provider's
minimum; one cache write per actor per cache lifetime; an explicit cache's storage over
the run's estimated time), and priced at the batch API's rates when the backend is
batched. The plan shows the cost without caching, with it, through a batch API, and the
cost per 1,000 accepted rows, the run's headline figure.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from factory.core.trajectory import Trajectory, canonical_json
from factory.engine.jobs.amplify import PRIOR_CALLS, yield_estimate
from factory.engine.pipeline import build_seed_check, check_seed_files, seed_rows_local
from factory.engine.prompts import PromptTemplate, estimate_tokens
from factory.engine.settings import seed_check_settings, stage_models
from factory.engine.stages.amplify import Companions
from factory.engine.stages.base import OK
from factory.envs.pack import load_domain
from factory.errors import ConfigError
from factory.llm.backends.base import CacheTerms
from factory.llm.backends.openai_wire import tokens_record
from factory.llm.costs import Workload, estimate, per_thousand, run_seconds
from factory.llm.pricing import PriceTable
from factory.llm.types import Usage
from factory.recipe import AmplifyRecipe, EnvsimRecipe, MixRecipe, Recipe

__all__ = ["Plan", "StagePlan", "Yield", "expected_yield", "make_plan"]


@dataclass
class StagePlan:
    """Planned LLM work of one stage, with the provider's prompt cache as assumed."""

    stage: str
    model: str
    calls: int
    input_tokens: int
    cached_tokens: int
    output_tokens: int
    cost_usd: float | None  # online, with caching; None: the model has no price
    batch_cost_usd: float | None = None  # the same calls through a batch API, with caching
    uncached_cost_usd: float | None = None  # online, nothing cached
    cache_write_tokens: int = 0
    storage_usd: float | None = None  # an explicit cache's storage (included above)
    cache_assumption: str = ""

    @property
    def usage(self) -> Usage:
        return Usage(
            input=self.input_tokens,
            cached_input=self.cached_tokens,
            cache_write=self.cache_write_tokens,
            output=self.output_tokens,
        )

    def to_dict(self) -> dict[str, Any]:
        """The plan's JSON (``--dry-run --json``): its token counts under the names of the
        factory's token record, input, cached, output in this order, as always (then the
        cache writes, where the provider bills them)."""
        tokens = tokens_record(self.usage)
        input_key, output_key, cached_key, *written = tokens  # the record's order
        return {
            "stage": self.stage,
            "model": self.model,
            "calls": self.calls,
            input_key: tokens[input_key],
            cached_key: tokens[cached_key],
            output_key: tokens[output_key],
            **{key: tokens[key] for key in written},
            "cost_usd": self.cost_usd,
            "batch_cost_usd": self.batch_cost_usd,
            "uncached_cost_usd": self.uncached_cost_usd,
            "storage_usd": self.storage_usd,
            "cache_assumption": self.cache_assumption,
        }


@dataclass(frozen=True)
class Costing:
    """How the plan prices calls: the recipe's backend, its provider's cache terms and
    batch API, the actors and concurrency the run's time is estimated with.

    Attributes:
        backend: ``llm.backend``.
        batched: the backend is a batch API (the run pays the batch prices).
        batch_backend: the backend to name for the batch column (None: none known).
        terms: the provider's ``CacheTerms`` (None: no cache assumed).
        explicit: the backend's option turns an explicit context cache on; "auto": where
            it pays (``pricing.explicit_cache_pays``, as the backend decides at run time).
        note: why no cache is assumed, when the backend is not installed here.
    """

    table: PriceTable
    backend: str = "aiohttp"
    batched: bool = False
    batch_backend: str | None = None
    terms: CacheTerms | None = None
    explicit: bool | Literal["auto"] = False
    writers: int = 1
    concurrency: int = 1
    note: str | None = None


def costing(cfg: Recipe) -> Costing:
    """The recipe's ``Costing``. A backend this installation lacks (``get_backend``
    raises) is planned without a provider cache, with a note saying so: the run itself
    refuses it."""
    from factory.llm.backends import available_backends, backend_options, get_backend

    table = PriceTable.from_config({k: v.model_dump() for k, v in cfg.prices.items()})
    llm = cfg.llm
    if llm is None:
        return Costing(table)
    writers, concurrency = cfg.ray.actors, llm.concurrency
    names = set(available_backends())
    batch_name = next(
        (n for n in (f"{llm.backend}_batch", "openai_batch") if n in names and _batched(n)), None
    )
    if llm.backend not in ("aiohttp", "openai") and batch_name == "openai_batch":
        batch_name = None  # OpenAI's Batch API takes the OpenAI backends' requests only
    try:
        plugin = get_backend(llm.backend)
        options = backend_options(plugin, llm.backend_options)
    except ConfigError as exc:
        note = f"no prompt cache assumed: {exc}"
        return Costing(
            table,
            llm.backend,
            batch_backend=batch_name,
            writers=writers,
            concurrency=concurrency,
            note=note,
        )
    terms = plugin.cache
    # The backend's explicit-cache switch (Gemini's ``explicit_cache: auto|on|off``).
    mode = getattr(options, "explicit_cache", False)
    explicit: bool | Literal["auto"] = "auto" if mode == "auto" else mode in (True, "on")
    return Costing(
        table,
        llm.backend,
        plugin.batched,
        llm.backend if plugin.batched else batch_name,
        terms,
        explicit,
        writers,
        concurrency,
    )


def _batched(name: str) -> bool:
    from factory.llm.backends import get_backend

    try:
        return get_backend(name).batched
    except ConfigError:
        return False


@dataclass(frozen=True)
class Yield:
    """The share of amplification calls expected to give a row, and where it comes from."""

    value: float
    source: str
    target: int = 0  # rows asked for
    calls: int = 0  # calls planned for them

    def line(self, label: str = "amplify") -> str:
        return (
            f"{label}: {self.calls:,} calls for {self.target:,} rows at a yield of "
            f"{self.value:.2f} ({self.source})"
        )


def expected_yield(cfg: AmplifyRecipe, measured: tuple[int, int] | None = None) -> Yield:
    """The yield to plan ``cfg``'s calls with, and its source.

    ``measured``: ``(rows, calls)`` of an earlier run of the output folder (its
    ``run.json`` totals); weighed with the recipe's value as the run's own planner
    weighs what comes back (``yield_estimate``), so 20 calls do not outweigh a
    recipe's rate, 200 do. Without it, the recipe's ``amplify.expected_yield``, named
    as a default when the recipe does not set it.
    """
    declared = cfg.amplify.expected_yield
    if measured is not None and measured[1] > 0:
        rows, calls = measured
        value = yield_estimate(rows, calls, declared)
        source = (
            f"measured in this folder: {rows:,} rows from {calls:,} calls, weighed with "
            f"amplify.expected_yield {declared:g} as {PRIOR_CALLS} calls"
        )
        return Yield(value, source)
    if "expected_yield" in cfg.amplify.model_fields_set:
        return Yield(declared, "amplify.expected_yield in the recipe")
    return Yield(declared, "amplify.expected_yield's default: set the recipe's own rate")


@dataclass
class Plan:
    seeds_read: int = 0
    seeds_valid: int = 0
    seeds_rejected: int = 0
    reject_reasons: Counter[str] = field(default_factory=Counter)
    stages: list[StagePlan] = field(default_factory=list)
    example_prompts: dict[str, list[dict[str, str]]] = field(default_factory=dict)
    yields: dict[str, Yield] = field(default_factory=dict)  # by amplify stage
    costing: Costing | None = None

    @property
    def expected_rows(self) -> int:
        """Accepted rows the plan's calls are for (the amplify targets)."""
        return sum(y.target for y in self.yields.values())

    def totals(self) -> dict[str, Any]:
        """The cost block: without caching, with it (online), through a batch API, what
        the run pays (the batch figure when its backend is batched) and that per 1,000
        accepted rows; a figure is None when a stage's model has no price."""
        batched = self.costing is not None and self.costing.batched

        def total(name: str) -> float | None:
            values = [getattr(s, name) for s in self.stages]
            return None if any(v is None for v in values) else sum(values)

        paid = total("batch_cost_usd" if batched else "cost_usd")
        return {
            "backend": self.costing.backend if self.costing else None,
            "batched": batched,
            "without_caching_usd": total("uncached_cost_usd"),
            "with_caching_usd": total("cost_usd"),
            "batch_usd": total("batch_cost_usd"),
            "expected_usd": paid,
            "expected_accepted_rows": self.expected_rows,
            "per_1k_accepted_usd": per_thousand(paid, self.expected_rows),
            "unpriced": sorted({s.model for s in self.stages if s.cost_usd is None}),
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "seeds": {
                "read": self.seeds_read,
                "valid": self.seeds_valid,
                "rejected": self.seeds_rejected,
                "reasons": dict(self.reject_reasons),
            },
            "stages": [s.to_dict() for s in self.stages],
            "yield": {stage: dict(y.__dict__) for stage, y in self.yields.items()},
            "cost": self.totals() if self.stages else None,
        }

    def render(self, *, show_prompts: bool = False) -> str:
        """The plan as text: seeds, then (``show_prompts``) one rendered prompt per LLM
        stage, then the cost table last, so a terminal's last screen shows the cost."""
        lines = [
            f"seeds: {self.seeds_read} read, {self.seeds_valid} valid, "
            f"{self.seeds_rejected} rejected",
        ]
        for code, n in self.reject_reasons.most_common():
            lines.append(f"  rejected {code}: {n}")
        for stage, messages in self.example_prompts.items() if show_prompts else ():
            lines.append("")
            lines.append(f"--- example {stage} prompt ---")
            for m in messages:
                lines.append(f"[{m['role']}]")
                lines.append(m["content"])
        for stage, planned in self.yields.items():
            lines.append(planned.line(stage))
        if self.stages:
            lines.append("")
            lines += self._cost_lines()
        return "\n".join(lines)

    def _cost_lines(self) -> list[str]:
        """The cost table, what its cache figures assume, and the totals: the last line
        is what the run is expected to pay, and that per 1,000 accepted rows."""

        def usd(value: float | None) -> str:
            return "unpriced" if value is None else f"{value:,.2f}"

        width = max([17, *(len(s.model) for s in self.stages)]) + 1  # a model id fits
        lines = [
            f"{'stage':<11}{'model':<{width}}{'calls':>9}{'prompt tok':>14}{'cached tok':>14}"
            f"{'completion tok':>16}{'no cache USD':>14}{'cost USD':>12}{'batch USD':>12}"
        ]
        for s in self.stages:
            lines.append(
                f"{s.stage:<11}{s.model:<{width}}{s.calls:>9,}{s.input_tokens:>14,}"
                f"{s.cached_tokens:>14,}{s.output_tokens:>16,}{usd(s.uncached_cost_usd):>14}"
                f"{usd(s.cost_usd):>12}{usd(s.batch_cost_usd):>12}"
            )
        c = self.costing or Costing(PriceTable())
        lines.append(f"prompt cache (llm.backend {c.backend}):")
        if c.note:
            lines.append(f"  {c.note}")
        for s in self.stages:
            lines.append(f"  {s.stage}: {s.cache_assumption}")
        t = self.totals()
        if t["with_caching_usd"] is None:
            lines.append(
                f"estimated total cost: unknown ({', '.join(t['unpriced'])} has no price: add "
                "it under prices: in the recipe to estimate and cap the spend)"
            )
            return lines
        saved = t["without_caching_usd"] - t["with_caching_usd"]
        batch = (
            f"; through a batch API (llm.backend {c.batch_backend}): {usd(t['batch_usd'])} USD"
            if c.batch_backend and not c.batched
            else ""
        )
        lines.append(
            f"estimated cost without caching {usd(t['without_caching_usd'])} USD, with "
            f"caching {usd(t['with_caching_usd'])} USD online (caching saves {usd(saved)} USD)"
            f"{batch}"
        )
        cache = "with caching" if any(s.cached_tokens for s in self.stages) else "no cache"
        how = f"through the batch API, {cache}" if c.batched else f"online, {cache}"
        per_k = t["per_1k_accepted_usd"]
        per = (
            f" = {usd(per_k)} USD per 1,000 accepted rows ({t['expected_accepted_rows']:,} "
            "expected)"
            if per_k is not None
            else ""
        )
        lines.append(f"estimated total cost: {usd(t['expected_usd'])} USD ({how}){per}")
        return lines


def _stage(
    c: Costing,
    stage: str,
    model: str,
    calls: int,
    per_call_prompt: float,
    static: int,
    per_call_completion: float,
) -> StagePlan:
    work = Workload(
        calls,
        static,
        per_call_prompt - static,
        per_call_completion,
        writers=c.writers,
        run_s=run_seconds(calls, c.concurrency, per_call_completion),
    )
    online = estimate(work, c.table.lookup(model), c.terms, explicit=c.explicit)
    batch = estimate(work, c.table.lookup_batch(model), c.terms, explicit=c.explicit)
    used = online.usage
    return StagePlan(
        stage,
        model,
        calls,
        used.input,
        used.cached_input,
        used.output,
        online.cached_usd,
        batch.cached_usd,
        online.uncached_usd,
        used.cache_write,
        (batch if c.batched else online).storage_usd,
        online.assumption,
    )


def make_plan(
    cfg: Recipe,
    *,
    with_examples: bool = True,
    measured: tuple[int, int] | None = None,
) -> Plan:
    """Check the seeds and estimate every LLM stage of ``cfg``; ``measured``: the
    ``(rows, calls)`` an earlier run of the output folder gave (``expected_yield``)."""
    if isinstance(cfg, MixRecipe):
        return _mixed_plan(cfg, with_examples=with_examples)
    if isinstance(cfg, EnvsimRecipe):  # no seeds and no LLM stage: nothing to plan
        return Plan()
    check_seed_files(cfg.seeds)  # the run's own check: a dry run refuses what the run refuses
    plan = Plan()
    domain = load_domain(cfg.domain)
    check = build_seed_check(seed_check_settings(cfg), domain)
    valid: list[Trajectory] = []
    for row in seed_rows_local(cfg.seeds):
        plan.seeds_read += 1
        if row["status"] == OK:
            row = check.run_one(row)
        if row["status"] == OK:
            valid.append(Trajectory.from_json(row["record"]))
        else:
            plan.reject_reasons[row["reason"] or "unknown"] += 1
    plan.seeds_valid = len(valid)
    plan.seeds_rejected = plan.seeds_read - plan.seeds_valid
    if not isinstance(cfg, AmplifyRecipe) or not valid:  # curate: no LLM stage to plan
        return plan
    plan.costing = priced = costing(cfg)

    if cfg.prefilter.enabled:
        judge = PromptTemplate(Path(cfg.prefilter.prompt), domain, key_path="prefilter.prompt")
        prompts = [judge.render(t) for t in valid]
        mean_prompt = sum(p.input_tokens() for p in prompts) / len(prompts)
        model = stage_models(cfg)["prefilter"]
        plan.stages.append(
            _stage(
                priced,
                "prefilter",
                model,
                len(valid),
                mean_prompt,
                prompts[0].static_tokens(),
                cfg.prefilter.completion_tokens_estimate,
            )
        )
        if with_examples:
            plan.example_prompts["prefilter"] = prompts[0].messages

    amplify = PromptTemplate(Path(cfg.amplify.prompt), domain, key_path="amplify.prompt")
    planned = expected_yield(cfg, measured)
    calls = math.ceil(cfg.amplify.target / planned.value)
    if cfg.amplify.max_calls is not None:
        calls = min(calls, cfg.amplify.max_calls)
    plan.yields["amplify"] = replace(planned, target=cfg.amplify.target, calls=calls)
    # A composition call shows companions beside its reference, and answers with them all.
    shown = Companions.of(domain, amplify, {t.id: t for t in valid}, cfg.amplify.seed)
    refs = [[t.id, *(shown.picked(t.id, i) if shown else [])] for i, t in enumerate(valid)]
    prompts = [
        amplify.render(t, variation=0, **(shown.extra(t.id, i) if shown else {}))
        for i, t in enumerate(valid)
    ]
    mean_prompt = sum(p.input_tokens() for p in prompts) / len(prompts)
    # A new trajectory is about as long as its references, written in the output format.
    size = {t.id: estimate_tokens(canonical_json(amplify.output_form(t))) for t in valid}
    mean_completion = sum(size[r] for ids in refs for r in ids) / len(valid)
    plan.stages.append(
        _stage(
            priced,
            "amplify",
            cfg.llm.model,
            calls,
            mean_prompt,
            prompts[0].static_tokens(),
            mean_completion,
        )
    )
    if with_examples:
        plan.example_prompts["amplify"] = prompts[0].messages
    return plan


def _mixed_plan(cfg: MixRecipe, *, with_examples: bool) -> Plan:
    """A recipe with parts: every part's plan, its stages named ``stage/label``."""
    from factory.engine.jobs.mix import part_label, part_recipe

    plan = Plan()
    for i, part in enumerate(cfg.parts):
        sub = make_plan(part_recipe(cfg, i, Path(cfg.output.dir)), with_examples=with_examples)
        label = part_label(part)
        plan.seeds_read += sub.seeds_read
        plan.seeds_valid += sub.seeds_valid
        plan.seeds_rejected += sub.seeds_rejected
        plan.reject_reasons.update(sub.reject_reasons)
        plan.costing = plan.costing or sub.costing
        for stage in sub.stages:
            stage.stage = f"{stage.stage}/{label}"
            plan.stages.append(stage)
        for stage_name, planned in sub.yields.items():
            plan.yields[f"{stage_name}/{label}"] = planned
        for stage_name, messages in sub.example_prompts.items():
            plan.example_prompts[f"{stage_name}/{label}"] = messages
    return plan
