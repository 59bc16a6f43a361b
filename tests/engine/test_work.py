"""Results are used in item order per stream, whatever order they arrive in."""

from __future__ import annotations

import random

import pytest

from factory.engine.work import Item, ItemResult, Reorder


def _issue(reorder: Reorder, stream: str, n: int) -> None:
    for k in range(n):
        reorder.issue(Item(stream, k, "c"))


def test_any_arrival_order_releases_in_index_order_per_stream() -> None:
    rng = random.Random(4)
    reorder = Reorder()
    _issue(reorder, "a", 50)
    _issue(reorder, "b", 20)
    arrivals = [ItemResult("a", k, []) for k in range(50)] + [
        ItemResult("b", k, []) for k in range(20)
    ]
    rng.shuffle(arrivals)
    released: list[tuple[str, int]] = []
    for result in arrivals:
        reorder.add(result)
        released += [r.key for r in reorder.release()]
    assert [k for s, k in released if s == "a"] == list(range(50))
    assert [k for s, k in released if s == "b"] == list(range(20))
    assert reorder.pending() == 0 and reorder.held() == 0


def test_a_straggler_holds_only_what_comes_after_it() -> None:
    reorder = Reorder()
    _issue(reorder, "s", 5)
    for k in (1, 2, 3):
        reorder.add(ItemResult("s", k, []))
    assert list(reorder.release()) == [] and reorder.held() == 3 and reorder.ahead("s") == 5
    reorder.add(ItemResult("s", 0, []))
    assert [r.index for r in reorder.release()] == [0, 1, 2, 3]
    assert reorder.pending("s") == 1


def test_the_oldest_unfinished_item_blocks_only_when_a_later_result_waits() -> None:
    reorder = Reorder()
    _issue(reorder, "a", 6)
    _issue(reorder, "b", 3)
    assert reorder.blocking() == []  # nothing came back: nobody is held up
    reorder.add(ItemResult("a", 0, []))
    list(reorder.release())
    assert reorder.blocking() == []  # 0 released at once: nothing waits
    reorder.add(ItemResult("a", 3, []))
    reorder.add(ItemResult("b", 2, []))
    assert reorder.blocking() == [("a", 1), ("b", 0)]
    reorder.add(ItemResult("a", 1, []))
    list(reorder.release())
    assert reorder.blocking() == [("a", 2), ("b", 0)]  # the next one in line
    for k in (2,):
        reorder.add(ItemResult("a", k, []))
    list(reorder.release())
    assert reorder.blocking() == [("b", 0)]


def test_gaps_twice_and_unissued_results_are_refused() -> None:
    reorder = Reorder()
    with pytest.raises(ValueError, match="issued, 0 expected"):
        reorder.issue(Item("s", 1, "c"))
    _issue(reorder, "s", 2)
    with pytest.raises(ValueError, match="never issued"):
        reorder.add(ItemResult("s", 2, []))
    reorder.add(ItemResult("s", 0, []))
    list(reorder.release())
    with pytest.raises(ValueError, match="twice"):
        reorder.add(ItemResult("s", 0, []))
