"""The dry-run plan (``factory.engine.plan``): what a recipe would call and cost."""

from __future__ import annotations

import pytest

from factory.core.trajectory import Trajectory, canonical_json
from factory.engine.pipeline import seed_rows_local
from factory.engine.plan import expected_yield, make_plan
from factory.engine.prompts import PromptTemplate, estimate_tokens
from factory.envs.pack import load_domain
from factory.llm.backends import BackendOptions, BackendPlugin, register_backend, reset_registry
from factory.llm.backends.base import CacheTerms
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


# -- cost with the chosen provider's cache and batch API (issue 35, point 4) ------------------


class _GeminiLike(BackendOptions):
    explicit_cache: bool = False


def _never(setup: object) -> object:
    raise AssertionError("a plan builds no backend")


@pytest.fixture
def providers():
    """Hand-made plug-ins with the providers' cache terms (their modules may not be
    installed here): marked Anthropic-like, explicit-cache Gemini-like."""
    reset_registry()
    register_backend(
        BackendPlugin(
            "anthropic", BackendOptions, _never, cache=CacheTerms(1024, 300.0, marked=True)
        ),
        replace=True,
    )
    register_backend(
        BackendPlugin(
            "gemini", _GeminiLike, _never, cache=CacheTerms(1024, 3600.0, explicit_cache=True)
        ),
        replace=True,
    )
    yield
    reset_registry()


def _airline(*sets: str):
    return make_plan(
        load_recipe(ROOT / "pipelines" / "airline.yaml", ["amplify.target=9000", *sets]),
        with_examples=False,
    )


def test_the_plan_shows_the_cost_without_and_with_caching_batch_and_per_thousand_rows() -> None:
    plan = _airline()
    t = plan.totals()
    assert t["backend"] == "aiohttp" and not t["batched"]
    assert t["batch_usd"] < t["with_caching_usd"] < t["without_caching_usd"]
    assert t["expected_usd"] == t["with_caching_usd"] and t["expected_accepted_rows"] == 9000
    assert t["per_1k_accepted_usd"] == pytest.approx(t["expected_usd"] * 1000 / 9000)
    amplify = plan.stages[-1]
    assert amplify.cache_write_tokens == 0  # OpenAI bills no write
    assert "cached automatically" in amplify.cache_assumption
    text = plan.render()
    last = text.splitlines()[-1]
    assert last.startswith("estimated total cost: ") and "(online, with caching)" in last
    assert f"{t['per_1k_accepted_usd']:,.2f} USD per 1,000 accepted rows (9,000 expected)" in last
    assert "llm.backend openai_batch" in text and "no cache USD" in text
    assert plan.to_dict()["cost"]["per_1k_accepted_usd"] == t["per_1k_accepted_usd"]


def test_a_batched_backend_plans_at_its_batch_prices() -> None:
    t = _airline("llm.backend=openai_batch").totals()
    assert t["batched"] and t["expected_usd"] == t["batch_usd"] < t["with_caching_usd"]
    assert (
        "(through the batch API, with caching)"
        in _airline("llm.backend=openai_batch").render().splitlines()[-1]
    )


def test_claude_plans_its_marked_cache_writes_at_their_price(providers) -> None:
    plan = _airline("llm.backend=anthropic", "llm.model=claude-sonnet-4-5")
    amplify = plan.stages[-1]
    assert amplify.model == "claude-sonnet-4-5" and amplify.cache_write_tokens > 0
    assert "marked for caching" in amplify.cache_assumption
    online = plan.totals()
    assert online["without_caching_usd"] > online["with_caching_usd"] > online["batch_usd"]
    assert "llm.backend anthropic" in plan.render()


def test_gemini_with_an_explicit_cache_counts_its_storage(providers) -> None:
    implicit = _airline("llm.backend=gemini", "llm.model=gemini-2.5-flash").stages[-1]
    explicit = _airline(
        "llm.backend=gemini",
        "llm.model=gemini-2.5-flash",
        "llm.backend_options={explicit_cache: true}",
    ).stages[-1]
    assert implicit.storage_usd == 0.0 and explicit.storage_usd > 0  # type: ignore[operator]
    assert "explicit context cache" in explicit.cache_assumption
    assert explicit.cost_usd < implicit.uncached_cost_usd  # type: ignore[operator]


def test_a_backend_not_installed_here_is_planned_without_a_cache_and_says_so() -> None:
    plan = _airline("llm.backend=nosuchprovider")
    assert all(s.cached_tokens == 0 for s in plan.stages)
    assert "no prompt cache assumed: llm.backend: unknown backend 'nosuchprovider'" in (
        plan.render()
    )
