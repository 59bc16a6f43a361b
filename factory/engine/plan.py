"""``--dry-run``: what a recipe would do and cost, without calling anything.

Seeds are read and checked for real (the same stage code as the run), so the
read/valid/rejected counts are exact. LLM calls and tokens are estimates:
calls from the target and the expected yield (``expected_yield``: the yield an
earlier run of the output folder measured, weighed as the run's own planner weighs
it, else the recipe's ``amplify.expected_yield``; the plan names which, since a
composition recipe that declared 0.8 and yielded 0.63 cost 27% more than planned,
issue 39); prompt tokens by
rendering the real prompts for the real seeds; completion tokens from the
size of the reference each call imitates. Prompt caching is assumed for the
static prefix after the first call of a kind (what OpenAI and vLLM do for a
byte-identical prefix), priced at the cached rate.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from factory.core.trajectory import Trajectory, canonical_json
from factory.engine.jobs.amplify import PRIOR_CALLS, yield_estimate
from factory.engine.pipeline import build_seed_check, check_seed_files, seed_rows_local
from factory.engine.prompts import PromptTemplate, estimate_tokens
from factory.engine.settings import llm_stages, seed_check_settings
from factory.engine.stages.amplify import Companions
from factory.engine.stages.base import OK
from factory.envs.pack import load_domain
from factory.llm.backends.openai_wire import tokens_record
from factory.llm.pricing import PriceTable, cost
from factory.llm.types import Usage
from factory.recipe import AmplifyRecipe, EnvsimRecipe, MixRecipe, Recipe

__all__ = ["Plan", "StagePlan", "Yield", "expected_yield", "make_plan"]


@dataclass
class StagePlan:
    """Planned LLM work of one stage."""

    stage: str
    model: str
    calls: int
    input_tokens: int
    cached_tokens: int
    output_tokens: int
    cost_usd: float | None  # None: the model has no price in the recipe
    batch_cost_usd: float | None = None  # the same calls through a batch API (Batch tier)

    @property
    def usage(self) -> Usage:
        return Usage(
            input=self.input_tokens, cached_input=self.cached_tokens, output=self.output_tokens
        )

    def to_dict(self) -> dict[str, Any]:
        """The plan's JSON (``--dry-run --json``): its token counts under the names of the
        factory's token record, input, cached, output in this order, as always."""
        tokens = tokens_record(self.usage)
        input_key, output_key, cached_key = tokens  # the record's order
        return {
            "stage": self.stage,
            "model": self.model,
            "calls": self.calls,
            input_key: tokens[input_key],
            cached_key: tokens[cached_key],
            output_key: tokens[output_key],
            "cost_usd": self.cost_usd,
            "batch_cost_usd": self.batch_cost_usd,
        }


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
            lines.append(
                f"{'stage':<11}{'model':<16}{'calls':>9}{'prompt tok':>14}{'cached tok':>14}"
                f"{'completion tok':>16}{'cost USD':>12}{'batch USD':>12}"
            )
            for s in self.stages:
                cost = "unpriced" if s.cost_usd is None else f"{s.cost_usd:,.2f}"
                batch = "unpriced" if s.batch_cost_usd is None else f"{s.batch_cost_usd:,.2f}"
                lines.append(
                    f"{s.stage:<11}{s.model:<16}{s.calls:>9,}{s.input_tokens:>14,}"
                    f"{s.cached_tokens:>14,}{s.output_tokens:>16,}{cost:>12}{batch:>12}"
                )
            priced = [s.cost_usd for s in self.stages if s.cost_usd is not None]
            batched = [s.batch_cost_usd for s in self.stages if s.batch_cost_usd is not None]
            lines.append(
                f"estimated total cost: {sum(priced):,.2f} USD online, {sum(batched):,.2f} USD "
                "through the Batch API (llm.backend: openai_batch)"
            )
        return "\n".join(lines)


def _cost(
    cfg: Recipe, model: str, prompt: int, cached: int, completion: int, *, batch: bool = False
) -> float | None:
    table = PriceTable.from_config({k: v.model_dump() for k, v in cfg.prices.items()})
    price = table.lookup_batch(model) if batch else table.lookup(model)
    if price is None:
        return None
    return cost(Usage(input=prompt, cached_input=min(cached, prompt), output=completion), price)


def _stage(
    cfg: Recipe,
    stage: str,
    model: str,
    calls: int,
    per_call_prompt: float,
    static: int,
    per_call_completion: float,
) -> StagePlan:
    prompt = round(per_call_prompt * calls)
    cached = static * max(calls - 1, 0)
    completion = round(per_call_completion * calls)
    return StagePlan(
        stage,
        model,
        calls,
        prompt,
        cached,
        completion,
        _cost(cfg, model, prompt, cached, completion),
        _cost(cfg, model, prompt, cached, completion, batch=True),
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

    if cfg.prefilter.enabled:
        judge = PromptTemplate(Path(cfg.prefilter.prompt), domain, key_path="prefilter.prompt")
        prompts = [judge.render(t) for t in valid]
        mean_prompt = sum(p.input_tokens() for p in prompts) / len(prompts)
        model = llm_stages(cfg)["prefilter"].model
        plan.stages.append(
            _stage(
                cfg,
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
            cfg,
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
        for stage in sub.stages:
            stage.stage = f"{stage.stage}/{label}"
            plan.stages.append(stage)
        for stage_name, planned in sub.yields.items():
            plan.yields[f"{stage_name}/{label}"] = planned
        for stage_name, messages in sub.example_prompts.items():
            plan.example_prompts[f"{stage_name}/{label}"] = messages
    return plan
