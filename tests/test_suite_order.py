"""The suite's order under ``--dist worksteal`` (``tests/conftest.long_first``): each
worker's block begins with its share of the long modules, each module kept whole."""

from __future__ import annotations

from tests.conftest import long_first


def test_each_workers_block_begins_with_its_share_of_the_long_modules() -> None:
    modules = ["a"] * 4 + ["long1"] * 2 + ["b"] * 3 + ["long2"] + ["c"] * 2 + ["long3"] * 2
    weights = {"long1": 90.0, "long2": 60.0, "long3": 50.0}
    order = long_first(modules, 2, weights)
    assert sorted(order) == list(range(len(modules)))  # every test once
    ordered = [modules[i] for i in order]
    half = len(modules) // 2  # worksteal's first block
    first, second = ordered[:half], ordered[half:]
    # Longest first onto the less loaded block: long1 | long2 then long3.
    assert first[:2] == ["long1", "long1"]
    assert second[:3] == ["long2", "long3", "long3"]
    # The rest follows in collection order, each test's relative order kept.
    rest = [i for i in order if modules[i] not in weights]
    assert rest == sorted(rest)


def test_without_long_modules_the_collection_order_stays() -> None:
    modules = ["a", "a", "b", "c"]
    assert long_first(modules, 2, {}) == [0, 1, 2, 3]
    assert long_first(modules, 1, {"b": 5.0}) == [2, 0, 1, 3]  # one block: long first
