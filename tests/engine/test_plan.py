"""Seed assignment across rounds, round sizing under caps, the budget state, resumability."""

from __future__ import annotations

import math
from collections import Counter

import pytest

from factory.config import load_recipe
from factory.core.trajectory import Trajectory, canonical_json
from factory.engine.budget import BudgetState
from factory.engine.jobs.amplify import plan_round
from factory.engine.pipeline import build_seed_check, seed_rows_local
from factory.engine.plan import make_plan
from factory.engine.prompts import PromptTemplate, estimate_tokens
from factory.engine.stages.amplify import assign, round_plan, seed_order
from factory.envs.pack import load_domain
from factory.errors import ConfigError
from factory.io.runstate import changed_keys, prepare_output
from tests.conftest import ROOT

SEEDS = [f"s{i:02d}" for i in range(7)]


def test_first_round_is_round_robin_without_replacement() -> None:
    order = seed_order(SEEDS, seed=3)
    assert order == seed_order(list(reversed(SEEDS)), seed=3) != seed_order(SEEDS, seed=4)
    picks = [assign(k, order) for k in range(20)]
    uses = Counter(seed for seed, _ in picks)
    assert max(uses.values()) - min(uses.values()) <= 1  # every seed once before any twice
    assert len(set(picks)) == 20  # (seed, variation) never repeats


def test_later_rounds_favour_seeds_below_their_share_and_never_repeat_a_request() -> None:
    order = seed_order(SEEDS, seed=0)
    made = [assign(k, order) for k in range(10)]
    accepted = {"s00": 3, "s01": 0, "s02": 1}
    calls = Counter(seed for seed, _ in made)
    cap = math.ceil(12 / len(SEEDS))  # 2
    room, base = round_plan(order, accepted, calls, cap)
    assert "s00" not in room and accepted.get(room[0], 0) == 0  # fewest accepted first
    assert room.index("s01") < room.index("s02")
    more = [assign(k, room, base) for k in range(15)]
    assert not set(made) & set(more) and len(set(more)) == 15
    # once every share is met, all seeds are used again
    assert round_plan(order, dict.fromkeys(SEEDS, 5), calls, cap)[0] == sorted(
        order, key=lambda s: 5
    )


@pytest.mark.parametrize(
    ("kw", "expected"),
    [
        ({"accepted": 0, "issued": 0}, (100, None)),  # first round: one call per row
        ({"accepted": 45, "issued": 50}, (math.ceil(55 / 0.9 * 1.05) + 2, None)),
        ({"accepted": 100, "issued": 120}, (0, None)),
    ],
)
def test_round_sizes(kw, expected) -> None:
    cfg = load_recipe(
        ROOT / "pipelines/airline.yaml", ["amplify.target=100", "amplify.max_cost_usd=null"]
    )
    assert plan_round(cfg, spent_usd=0, tokens=0, **kw) == expected


def test_round_sizes_respect_caps() -> None:
    cfg = load_recipe(
        ROOT / "pipelines/airline.yaml",
        ["amplify.target=100", "amplify.max_calls=60", "amplify.max_cost_usd=10"],
    )
    assert plan_round(cfg, accepted=40, issued=60, spent_usd=1, tokens=0) == (0, "max_calls")
    cfg = load_recipe(
        ROOT / "pipelines/airline.yaml", ["amplify.target=100", "amplify.max_cost_usd=10"]
    )
    assert plan_round(cfg, accepted=10, issued=20, spent_usd=10.5, tokens=0) == (0, "max_cost_usd")
    n, _ = plan_round(cfg, accepted=10, issued=20, spent_usd=8, tokens=0)
    assert n == 5  # (10 - 8) USD left / 0.4 USD per call so far


def test_budget_state_stops_new_calls_at_the_cap() -> None:
    b = BudgetState(max_cost_usd=1.0)
    started = 0
    while b.try_start():
        started += 1
        b.finish(0.3, 100)
    assert started == 4 and b.cost_usd == pytest.approx(1.2) and b.stopped_by == "max_cost_usd"
    assert BudgetState(max_calls=2).try_start() and not BudgetState(max_calls=0).try_start()
    t = BudgetState(max_tokens=150)
    assert t.try_start()
    t.finish(0, 200)
    assert not t.try_start() and t.stopped_by == "max_tokens"


def test_budget_reservations_count_at_submission_and_settle_on_the_answer() -> None:
    """A batched request reserves its estimate when submitted: one whose reservation
    would cross a cap is refused, the answer replaces the reservation by the real spend
    and a request without an answer gives it back."""
    b = BudgetState(max_cost_usd=1.0, max_tokens=10_000)
    assert b.try_start(0.4, 1000) and b.try_start(0.4, 1000)
    assert not b.try_start(0.4, 1000) and b.stopped_by == "max_cost_usd"  # 1.2 > 1.0
    assert b.calls == 2 and b.refused == 1 and b.reserved_cost_usd == pytest.approx(0.8)
    b.finish(0.1, 300, (0.4, 1000))  # answered: cheaper than reserved
    assert b.cost_usd == pytest.approx(0.1) and b.reserved_cost_usd == pytest.approx(0.4)
    assert b.reserved_tokens == 1000 and b.tokens == 300
    b.release(0.4, 1000)  # the other one failed: no bill
    assert b.reserved_cost_usd == pytest.approx(0.0) and b.reserved_tokens == 0
    assert b.try_start(0.4, 1000)  # room again: 0.1 spent + 0.4 reserved
    t = BudgetState(max_tokens=1500)
    assert t.try_start(0.0, 1000) and not t.try_start(0.0, 1000)
    assert t.stopped_by == "max_tokens"
    online = BudgetState(max_cost_usd=1.0)  # no estimate: start while below the cap
    assert online.try_start() and online.reserved_cost_usd == 0.0


def test_changed_keys_ignore_resumable_settings() -> None:
    old = {
        "amplify": {"target": 10, "seed": 0, "max_cost_usd": 1},
        "llm": {"model": "a"},
        "ray": {"actors": 2},
    }
    new = {
        "amplify": {"target": 50, "seed": 1, "max_cost_usd": 9},
        "llm": {"model": "b"},
        "ray": {"actors": 4},
    }
    assert changed_keys(old, new) == ["amplify.seed", "llm.model"]


def test_prepare_output_resume_refuse_fresh_done(tmp_path) -> None:
    cfg = load_recipe(ROOT / "pipelines/airline-seeds.yaml")
    out = tmp_path / "o"
    assert prepare_output(cfg, out, fresh=False, retry_failed=False) == "new"
    (out / "data").mkdir()
    (out / "data" / "part-00000.parquet").write_bytes(b"x")
    (out / "cache").mkdir()
    (out / "cache" / "w.jsonl").write_text("{}")
    assert prepare_output(cfg, out, fresh=False, retry_failed=False) == "resume"
    assert not (out / "data").exists() and (out / "cache" / "w.jsonl").exists()
    other = load_recipe(ROOT / "pipelines/airline-seeds.yaml", ["output.reasoning=strip"])
    with pytest.raises(ConfigError) as info:
        prepare_output(other, out, fresh=False, retry_failed=False)
    assert info.value.key_path == "output.reasoning" and "--fresh" in str(info.value)
    assert prepare_output(other, out, fresh=True, retry_failed=False) == "new"
    assert (out / "cache" / "w.jsonl").exists()  # paid for: --fresh keeps it
    assert prepare_output(other, out, fresh=True, retry_failed=False, drop_cache=True) == "new"
    assert not (out / "cache").exists()


def test_request_ids_are_stable_and_change_only_with_their_template(tmp_path) -> None:
    import shutil

    from factory.core.formats import parse_record
    from factory.engine.prompts import PromptTemplate
    from factory.engine.stages.llm_stage import request_id
    from factory.envs.pack import load_domain

    cfg = load_recipe(ROOT / "pipelines/airline.yaml")
    domain = load_domain(cfg)
    seed = parse_record(
        __import__("json").loads((ROOT / "seeds/airline/seeds.jsonl").read_text().splitlines()[0]),
        source="s:0",
    )

    def ids(folder) -> tuple[str, str]:
        amp = PromptTemplate(folder / "amplify.j2", domain).render(seed, variation=3)
        judge = PromptTemplate(folder / "prefilter.j2", domain).render(seed)
        return (
            request_id("amplify", "m", {"t": 1}, amp.messages, seed=seed.id, variation=3),
            request_id("prefilter", "m", {"t": 1}, judge.messages, seed=seed.id),
        )

    shutil.copy(ROOT / "prompts/amplify.j2", tmp_path / "amplify.j2")
    shutil.copy(ROOT / "prompts/prefilter.j2", tmp_path / "prefilter.j2")
    first = ids(tmp_path)
    assert ids(tmp_path) == first  # same content, same ids
    text = (tmp_path / "amplify.j2").read_text().replace("ONE new", "one new")
    (tmp_path / "amplify.j2").write_text(text)
    changed = ids(tmp_path)
    assert changed[0] != first[0] and changed[1] == first[1]  # only the amplify ids moved


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
