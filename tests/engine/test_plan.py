"""The dry-run plan (``factory.engine.plan``): what a recipe would call and cost."""

from __future__ import annotations

from factory.core.trajectory import Trajectory, canonical_json
from factory.engine.pipeline import seed_rows_local
from factory.engine.plan import expected_yield, make_plan
from factory.engine.prompts import PromptTemplate, estimate_tokens
from factory.envs.pack import load_domain
from factory.recipe import load_recipe
from tests.conftest import ROOT
from tests.helpers import seed_check_stage


def test_a_composition_plan_counts_the_companions_in_prompts_and_answers() -> None:
    cfg = load_recipe(ROOT / "pipelines" / "office-compose.yaml", ["amplify.target=100"])
    plan = make_plan(cfg)
    amplify = next(s for s in plan.stages if s.stage == "amplify")
    assert plan.seeds_valid == 32
    assert "### Companion references" in plan.example_prompts["amplify"][1]["content"]
    # A composed answer is two or three one-app episodes long, not one.
    assert cfg.amplify is not None
    template = PromptTemplate(cfg.resolve(cfg.amplify.prompt), load_domain(cfg.domain))
    check = seed_check_stage(cfg)
    seeds = [
        Trajectory.from_json(check.run_one(row)["record"]) for row in seed_rows_local(cfg.seeds)
    ]
    one = sum(estimate_tokens(canonical_json(template.output_form(t))) for t in seeds) / 32
    assert 1.8 * one < amplify.output_tokens / amplify.calls < 3.2 * one


def test_the_plan_names_where_its_yield_comes_from() -> None:
    # Issue 39: the plan's calls came from a yield nobody had measured, and it did not say so.
    from factory.recipe import AmplifyConfig

    cfg = load_recipe(ROOT / "pipelines" / "office-compose.yaml", ["amplify.target=100"])
    assert cfg.amplify is not None and cfg.amplify.expected_yield == 0.65
    declared = expected_yield(cfg)
    assert (declared.value, declared.source) == (0.65, "amplify.expected_yield in the recipe")
    assert cfg.amplify is not None
    unset = cfg.model_copy(update={"amplify": AmplifyConfig(target=100, prompt=cfg.amplify.prompt)})
    assert "default" in expected_yield(unset).source
    # An earlier run of the folder measured 109 rows from 173 calls: the plan uses it,
    # weighed with the recipe's value as the run's own planner does.
    measured = expected_yield(cfg, (109, 173))
    assert measured.value == (109 + 0.65 * 20) / (173 + 20)
    assert measured.source.startswith("measured in this folder: 109 rows from 173 calls")
    plan = make_plan(cfg, with_examples=False, measured=(109, 173))
    amplify = next(s for s in plan.stages if s.stage == "amplify")
    assert amplify.calls == 159  # ceil(100 / 0.632)
    text = plan.render()
    assert "amplify: 159 calls for 100 rows at a yield of 0.63 (measured in this folder" in text
    assert plan.to_dict()["yield"]["amplify"]["calls"] == 159
    assert make_plan(cfg, with_examples=False).stages[1].calls == 154  # ceil(100 / 0.65)
