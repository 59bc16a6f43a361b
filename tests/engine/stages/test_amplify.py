"""Call assignment: round-robin over the seeds, a pure function of the call number."""

from __future__ import annotations

from collections import Counter

from factory.engine.stages.amplify import assign, seed_order

SEEDS = [f"s{i:02d}" for i in range(7)]


def test_calls_are_round_robin_without_replacement() -> None:
    order = seed_order(SEEDS, seed=3)
    assert order == seed_order(list(reversed(SEEDS)), seed=3) != seed_order(SEEDS, seed=4)
    picks = [assign(k, order) for k in range(20)]
    uses = Counter(seed for seed, _ in picks)
    assert max(uses.values()) - min(uses.values()) <= 1  # every seed once before any twice
    assert len(set(picks)) == 20  # (seed, variation) never repeats


def test_a_call_is_a_pure_function_of_its_number_and_never_repeats_a_request() -> None:
    """No history goes into an assignment: a resume or a rerun issuing call k makes the
    same request (answered from the cache), whatever came back before."""
    order = seed_order(SEEDS, seed=0)
    first = [assign(k, order) for k in range(50)]
    assert [assign(k, list(order)) for k in reversed(range(50))][::-1] == first
    assert len(set(first)) == 50
    assert [v for s, v in first if s == order[0]] == [0, 1, 2, 3, 4, 5, 6, 7]
