"""One ledger per run: spend per stage as results arrive, fates as rows are used, caps."""

from __future__ import annotations

import json

import pytest

from factory.engine.ledger import Caps, Ledger
from factory.engine.work import ItemResult
from factory.llm.types import Usage


def _row(stage: str, *, cost: float = 0.0, cached: bool = False, status: str = "ok", **kw):
    row = {
        "llm_stage": stage,
        "status": status,
        "stage": kw.pop("decided_by", stage),
        "usage": json.dumps({"prompt_tokens": 100, "completion_tokens": 10, "cached_tokens": 40}),
        "cost_usd": cost,
        "paid_usd": 0.0 if cached else cost,
        "cached_responses": int(cached),
        "calls": int(not cached),
        "completion": "x",
    }
    row.update(kw)
    return row


def test_spend_is_counted_per_stage_on_arrival() -> None:
    ledger = Ledger()
    ledger.arrived(ItemResult("seeds", 0, [_row("prefilter", cost=0.01)]))
    ledger.arrived(ItemResult("calls", 0, [_row("amplify", cost=0.5)]))
    ledger.arrived(ItemResult("calls", 1, [_row("amplify", cost=0.5, cached=True)]))
    ledger.arrived(
        ItemResult("calls", 2, [_row("amplify", status="unissued", usage=None, calls=0)])
    )
    fields = ledger.manifest_fields()
    assert fields["by_stage"]["amplify"]["cost_usd"] == 1.0
    assert fields["by_stage"]["amplify"]["cost_usd_paid_this_run"] == 0.5
    assert fields["by_stage"]["amplify"]["calls"] == 1
    assert fields["by_stage"]["amplify"]["responses_from_cache"] == 1
    assert fields["unissued_by_stage"] == {"amplify": 1, "prefilter": 0}
    assert fields["tokens"]["prompt_tokens"] == 300  # the unissued row has no usage
    assert fields["cost_usd"] == pytest.approx(1.01)
    assert ledger.results == 4 and ledger.calls == 2


def test_fates_are_counted_by_their_deciding_stage() -> None:
    ledger = Ledger()
    ledger.decided({"stage": "postprocess"}, "accepted")
    ledger.decided({"stage": "dedup", "reason": "duplicate"}, "rejected")
    ledger.decided({"stage": "amplify", "reason": "timeout"}, "failed")
    ledger.decided({"stage": "postprocess"}, "surplus")
    assert ledger.totals() == {
        "total": 4,
        "accepted": 1,
        "surplus": 1,
        "rejected": 1,
        "failed": 1,
    }
    assert ledger.stages() == {
        "postprocess": {"accepted": 1, "surplus": 1},
        "dedup": {"rejected": 1},
        "amplify": {"failed": 1},
    }
    assert dict(ledger.reasons["dedup"]) == {"duplicate": 1}


def test_max_calls_is_exact_counting_what_is_in_flight() -> None:
    ledger = Ledger(Caps(max_calls=10))
    assert ledger.allowance(64, in_flight=0) == 10
    assert ledger.allowance(64, in_flight=6) == 4
    for k in range(10):
        ledger.arrived(ItemResult("calls", k, [_row("amplify", cost=0.1)]))
    assert ledger.exhausted() == "max_calls"
    assert ledger.allowance(64, in_flight=0) == 0 and ledger.stopped_by == "max_calls"


def test_cost_and_token_caps_count_cached_spend_and_stop_new_work() -> None:
    ledger = Ledger(Caps(max_cost_usd=1.0))
    for k in range(3):
        ledger.arrived(ItemResult("calls", k, [_row("amplify", cost=0.3, cached=True)]))
    # 0.1 left: less than a call costs on average; still below the cap, so one more may
    # start when none is out, none while one is
    assert ledger.exhausted() is None and ledger.allowance(5, 0) == 1
    assert ledger.allowance(5, in_flight=1) == 0 and ledger.stopped_by is None
    ledger.arrived(ItemResult("calls", 3, [_row("amplify", cost=0.3)]))
    assert ledger.exhausted() == "max_cost_usd" and ledger.allowance(5, 0) == 0
    tokens = Ledger(Caps(max_tokens=220))
    tokens.arrived(ItemResult("calls", 0, [_row("amplify")]))
    assert tokens.exhausted() is None  # 110 of 220 (prompt + completion; cached are prompt)
    tokens.arrived(ItemResult("calls", 1, [_row("amplify")]))
    assert tokens.run_tokens == 220 and tokens.exhausted() == "max_tokens"


def test_calls_in_flight_count_at_the_average_cost_against_a_cap() -> None:
    ledger = Ledger(Caps(max_cost_usd=3.0))
    assert ledger.allowance(64, in_flight=0) == 64  # nothing known yet
    for k in range(2):
        ledger.arrived(ItemResult("calls", k, [_row("amplify", cost=0.5)]))
    assert ledger.allowance(64, in_flight=0) == 4  # 2.0 left / 0.5
    assert ledger.allowance(64, in_flight=3) == 1  # three out cost ~1.5 of it
    assert ledger.allowance(64, in_flight=4) == 0


def test_a_batched_backend_reserves_an_estimate_until_its_answer_settles_it() -> None:
    ledger = Ledger(Caps(max_cost_usd=1.0))
    estimate = (0.3, 1000)
    n = ledger.allowance(10, in_flight=0, estimate=estimate)
    assert n == 3  # 3 x 0.3 fits, a fourth would cross the cap
    ledger.reserve(n, estimate)
    assert ledger.allowance(10, in_flight=3, estimate=estimate) == 0
    ledger.arrived(ItemResult("calls", 0, [_row("amplify", cost=0.1)]), reserved=estimate)
    assert ledger.reserved_usd == pytest.approx(0.6) and ledger.cost_usd == pytest.approx(0.1)
    assert ledger.allowance(10, in_flight=2, estimate=estimate) == 1


def test_the_timeline_spans_the_run_and_stays_small() -> None:
    ledger = Ledger(started=0.0)
    ledger._timeline_every = 0.0
    for k in range(1000):
        ledger.arrived(ItemResult("calls", k, []))
    points = ledger.manifest_fields()["timeline"]["points"]
    assert len(points) <= 401 and points[-1][6] == 1000  # results arrived, last column


def test_the_main_progress_bar_shows_the_run_tokens_and_what_this_run_paid() -> None:
    from factory.engine.loop import Bar, with_spend

    ledger = Ledger()
    bars = [Bar("seeds checked", 3, 3), Bar("accepted", 1, 10, {"calls": 2})]
    assert with_spend(bars, ledger) == bars  # nothing called yet: nothing to show
    ledger.arrived(ItemResult("calls", 0, [_row("amplify", cost=0.5)]))
    ledger.arrived(ItemResult("calls", 1, [_row("amplify", cost=0.5, cached=True)]))
    seeds, main = with_spend(bars, ledger)
    assert seeds == bars[0]
    tokens = ledger.manifest_fields()["tokens"]
    assert main.postfix == {
        "calls": 2,
        "tok": tokens["prompt_tokens"] + tokens["completion_tokens"],
        "usd": "0.50",  # the cached answer was paid by an earlier run
    }


@pytest.mark.parametrize(
    ("caps", "spend"),
    [
        (Caps(max_cost_usd=1.0), [(0.3, 0), (0.3, 0), (0.3, 0), (0.3, 0)]),
        (Caps(max_tokens=250), [(0.0, 110), (0.0, 110), (0.0, 110)]),
        (Caps(max_calls=2), [(0.0, 0), (0.0, 0), (0.0, 0)]),
    ],
)
def test_the_run_ledger_and_the_simulated_environments_budget_stop_at_the_same_spend(
    caps: Caps, spend: list[tuple[float, int]]
) -> None:
    """One cap calculation (``cap_reached``): the data run's ledger and the simulated
    environments' ``BudgetState`` name the same cap after the same calls."""
    from factory.engine.budget import BudgetState

    ledger = Ledger(caps)
    state = BudgetState(caps.max_cost_usd, caps.max_tokens, caps.max_calls)
    seen = []
    for k, (cost, tokens) in enumerate(spend):
        seen.append((ledger.exhausted(), state.exhausted()))
        state.try_start()
        state.finish(cost, tokens)
        usage = json.dumps({"prompt_tokens": tokens, "completion_tokens": 0})
        row = {"llm_stage": "amplify", "usage": usage, "cost_usd": cost, "calls": 1}
        ledger.arrived(ItemResult("calls", k, [row]))
    seen.append((ledger.exhausted(), state.exhausted()))
    assert all(a == b for a, b in seen), seen
    assert seen[-1][0] is not None and seen[0] == (None, None)


def test_a_reservation_that_would_cross_a_cap_is_named_by_the_same_calculation() -> None:
    from factory.engine.ledger import cap_reached

    caps = Caps(max_cost_usd=1.0, max_tokens=1000)
    assert cap_reached(caps, 0.7, 0, 0) is None
    assert cap_reached(caps, 0.7, 0, 0, adding=(0.4, 0)) == "max_cost_usd"
    assert cap_reached(caps, 0.0, 700, 0, adding=(0.0, 400)) == "max_tokens"
    assert cap_reached(caps, 1.0, 0, 0) == "max_cost_usd"  # reached, not only crossed


def test_a_ledger_carries_spend_made_apart_against_its_caps_and_says_what_is_left() -> None:
    """A mixed recipe's run-wide ledger: each part's spend (from its manifest) counts
    against the caps; what is left is the next part's caps, at least a sliver."""
    ledger = Ledger(Caps(max_cost_usd=1.0, max_tokens=1000, max_calls=10))
    ledger.carry("airline", Usage(input=300, output=100), 0.25, 4)
    assert ledger.left() == Caps(max_cost_usd=0.75, max_tokens=600, max_calls=6)
    assert ledger.exhausted() is None and ledger.usage == Usage(input=300, output=100)
    ledger.carry("retail", Usage(input=500, output=200), 0.5, 6)
    assert ledger.exhausted() == "max_tokens"  # 0.75 of 1.0 USD, but 1100 of 1000 tokens
    left = ledger.left()
    assert left.max_tokens == 1 and left.max_calls == 1
    assert left.max_cost_usd == pytest.approx(0.25)
    assert Caps().left(5.0, 5, 5) == Caps()  # no cap: nothing to leave


def test_every_stage_has_its_cache_read_share_and_what_caching_and_batching_saved() -> None:
    from factory.llm.pricing import Price, cost

    online = Price(2.0, 0.2, 8.0, cache_write_per_mtok=2.5)
    batch = online.scaled(0.5)
    ledger = Ledger(prices={"prefilter": (None, None), "amplify": (batch, online)})
    usage = {"prompt_tokens": 1000, "completion_tokens": 10, "cached_tokens": 600}
    written = {**usage, "cache_write_tokens": 300}
    ledger.arrived(ItemResult("seeds", 0, [_row("prefilter", usage=json.dumps(usage))]))
    for i, used in enumerate((usage, written)):
        ledger.arrived(ItemResult("calls", i, [_row("amplify", cost=0.1, usage=json.dumps(used))]))
    stages = ledger.manifest_fields()["by_stage"]
    assert stages["prefilter"]["cache_read_share"] == 0.6
    assert "cache_saved_usd" not in stages["prefilter"]  # unpriced: a share, no dollars
    amp = stages["amplify"]
    assert amp["cache_read_share"] == 0.6 and amp["tokens"]["cache_write_tokens"] == 300
    spent = Usage(input=2000, cached_input=1200, cache_write=300, output=20)
    full = cost(Usage(input=2000, output=20), batch)
    assert amp["cache_saved_usd"] == pytest.approx(full - cost(spent, batch), abs=1e-6)
    assert amp["batch_saved_usd"] == pytest.approx(cost(spent, online) / 2, abs=1e-6)
    assert ledger.savings() == {
        "cache_saved_usd": amp["cache_saved_usd"],
        "batch_saved_usd": amp["batch_saved_usd"],
    }
    assert Ledger(prices={"amplify": (None, None)}).savings() == {
        "cache_saved_usd": None,
        "batch_saved_usd": None,
    }
