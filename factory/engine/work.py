"""Work items, their results, and the order results are used in (pure, no Ray).

Why an order at all when rows "arrive as they finish": a run must be reproducible.
Every work item has a place in its stream (seed record ``n``, amplification call
``k``, episode ``e``), and the driver *uses* results in that order: the first
duplicate kept is the one with the lowest index, the target is reached at a fixed
call, a mixture chooses among the same candidates. Results still *arrive* in any
order and are counted at once (progress, spend, budget); ``Reorder`` holds the
early ones until the results before them are in. So the same recipe with the same
response cache writes the same shards, byte for byte, however the calls raced.

The held results are bounded by what the driver let out ahead of the oldest
unfinished item (``Reorder.ahead``): the planner issues no item further ahead than
``max_ahead`` (``factory.engine.loop``).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from factory.engine.rows import Row

__all__ = ["Item", "ItemResult", "Reorder"]


@dataclass(frozen=True)
class Item:
    """One unit of work: ``chain`` (which stages) over ``row`` (the first stage's input).

    ``stream`` and ``index`` name its place: results are used in ``index`` order
    within a stream. ``llm`` says whether the chain makes LLM calls (the budget and
    the calls-in-flight bound count it).
    """

    stream: str
    index: int
    chain: str
    row: dict[str, Any] = field(default_factory=dict)
    llm: bool = False

    @property
    def key(self) -> tuple[str, int]:
        return self.stream, self.index


@dataclass
class ItemResult:
    """What a worker made of one item: its final rows (zero, one or many).

    ``cancelled``: the item never started (the run stopped issuing): its rows are
    empty and it counts nowhere, as if it had not been issued.
    """

    stream: str
    index: int
    rows: list[Row]
    cancelled: bool = False

    @property
    def key(self) -> tuple[str, int]:
        return self.stream, self.index


class Reorder:
    """Results in, results out in index order per stream (each stream counts from 0).

    ``issue(item)`` before an item goes out, ``add(result)`` when it comes back,
    ``release()`` yields every result whose predecessors are all in.
    """

    def __init__(self) -> None:
        self._next: dict[str, int] = {}  # next index to release, per stream
        self._issued: dict[str, int] = {}  # next index to issue, per stream
        self._held: dict[tuple[str, int], ItemResult] = {}

    def issue(self, item: Item) -> None:
        expected = self._issued.get(item.stream, 0)
        if item.index != expected:
            raise ValueError(
                f"stream {item.stream!r}: item {item.index} issued, {expected} expected"
            )
        self._issued[item.stream] = expected + 1
        self._next.setdefault(item.stream, 0)

    def add(self, result: ItemResult) -> None:
        key = result.key
        if key in self._held or result.index < self._next.get(result.stream, 0):
            raise ValueError(f"result {key} arrived twice")
        if result.index >= self._issued.get(result.stream, 0):
            raise ValueError(f"result {key} was never issued")
        self._held[key] = result

    def release(self) -> Iterator[ItemResult]:
        for stream in list(self._next):
            n = self._next[stream]
            while (stream, n) in self._held:
                yield self._held.pop((stream, n))
                n += 1
                self._next[stream] = n

    def pending(self, stream: str | None = None) -> int:
        """Items issued and not released yet (in one stream, or in all)."""
        streams = [stream] if stream is not None else list(self._issued)
        return sum(self._issued.get(s, 0) - self._next.get(s, 0) for s in streams)

    def ahead(self, stream: str) -> int:
        """How far the next item to issue is ahead of the oldest unreleased one."""
        return self._issued.get(stream, 0) - self._next.get(stream, 0)

    def issued(self, stream: str) -> int:
        return self._issued.get(stream, 0)

    def blocking(self) -> list[tuple[str, int]]:
        """The items that hold back results already in: per stream, the oldest unreleased
        item when a later one of its stream is held (the driver hurries it)."""
        streams = {stream for stream, _ in self._held}
        return [(s, self._next[s]) for s in sorted(streams)]

    def held(self) -> int:
        """Results waiting for a predecessor (what the order costs in memory)."""
        return len(self._held)
