"""The budget state the simulated environments share (``factory.engine.budget``)."""

from __future__ import annotations

import pytest

from factory.engine.budget import BudgetState


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
