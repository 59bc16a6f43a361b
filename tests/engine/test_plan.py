"""The dry-run plan (``factory.engine.plan``): what a recipe would call and cost."""

from __future__ import annotations

from factory.config import load_recipe
from factory.core.trajectory import Trajectory, canonical_json
from factory.engine.pipeline import build_seed_check, seed_rows_local
from factory.engine.plan import make_plan
from factory.engine.prompts import PromptTemplate, estimate_tokens
from factory.envs.pack import load_domain
from tests.conftest import ROOT


def test_a_composition_plan_counts_the_companions_in_prompts_and_answers() -> None:
    cfg = load_recipe(ROOT / "pipelines" / "office-compose.yaml", ["amplify.target=100"])
    plan = make_plan(cfg)
    amplify = next(s for s in plan.stages if s.stage == "amplify")
    assert plan.seeds_valid == 32
    assert "### Companion references" in plan.example_prompts["amplify"][1]["content"]
    # A composed answer is two or three one-app episodes long, not one.
    assert cfg.amplify is not None
    template = PromptTemplate(cfg.resolve(cfg.amplify.prompt), load_domain(cfg))
    check = build_seed_check(cfg)
    seeds = [Trajectory.from_json(check.run_one(row)["record"]) for row in seed_rows_local(cfg)]
    one = sum(estimate_tokens(canonical_json(template.output_form(t))) for t in seeds) / 32
    assert 1.8 * one < amplify.completion_tokens / amplify.calls < 3.2 * one
