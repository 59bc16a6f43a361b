"""Who holds which work item: the actor pool's bookkeeping, pure (no Ray here).

The pool (``factory.engine.pool.ActorPool``) is a thin Ray adapter over this: it
makes the Ray calls, and tells the roster what happened (a worker answered for
the first time, a worker was lost, results came back); the roster says where each
item goes and what the pool may take on.

Why a roster (issue 33): on a cluster a worker is lost with its node, and a new
one may start only when the cluster has room again, or never. So a worker is
``STARTING`` until its first answer (it takes no item before: an actor that
cannot be placed would hold its items forever), ``READY``, or ``LOST``. The
items a lost worker held go to a **backlog** that the ready workers drain first;
the pool's room counts the backlog, so the driver never issues past what the
survivors can hold, and nothing a lost worker held is ever forgotten. A result
is taken only from the worker that holds its item: a lost worker's late answer
(an actor Ray declared unavailable that still answered) is dropped, since its
item was issued again.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from factory.engine.work import Item, ItemResult

__all__ = ["Member", "Roster", "State"]


class State(enum.Enum):
    STARTING = "starting"  # created, not answered yet (maybe waiting for room in the cluster)
    READY = "ready"
    LOST = "lost"


@dataclass
class Member:
    """One worker place of the pool: worker ``number``, its ``generation``-th actor."""

    number: int
    generation: int = 0
    state: State = State.STARTING
    assigned: dict[tuple[str, int], Item] = field(default_factory=dict)
    node: str | None = None  # the node it runs on, once it said

    @property
    def load(self) -> int:
        return len(self.assigned)


class Roster:
    """``size`` worker places of ``capacity`` items each; ``replacements`` new actors
    may be started, in all, for lost ones."""

    def __init__(self, size: int, capacity: int, replacements: int) -> None:
        self.capacity = capacity
        self.members = [Member(i) for i in range(size)]
        self.backlog: list[Item] = []
        self.replacements_left = replacements
        self.lost = 0  # actors lost so far

    # -- what the pool may take ------------------------------------------------------------
    def ready(self) -> list[Member]:
        return [m for m in self.members if m.state is State.READY]

    def room(self) -> int:
        """Items the driver may issue now: the ready workers' free places, less what
        already waits for one (items of lost workers)."""
        free = sum(max(0, self.capacity - m.load) for m in self.ready())
        return max(0, free - len(self.backlog))

    @property
    def in_flight(self) -> int:
        return sum(m.load for m in self.members) + len(self.backlog)

    # -- where items go --------------------------------------------------------------------
    def place(self, items: Sequence[Item]) -> dict[int, list[Item]]:
        """Queue ``items`` behind the backlog and hand out what fits: each to the least
        loaded ready worker with a free place. Returns {worker number: its new items};
        what does not fit stays in the backlog."""
        self.backlog.extend(items)
        out: dict[int, list[Item]] = {}
        ready = self.ready()
        if not ready:
            return out
        kept: list[Item] = []
        for item in self.backlog:
            member = min(ready, key=lambda m: m.load)
            if member.load >= self.capacity:
                kept.append(item)
                continue
            member.assigned[item.key] = item
            out.setdefault(member.number, []).append(item)
        self.backlog = kept
        return out

    def holder(self, keys: Iterable[tuple[str, int]]) -> dict[int, list[tuple[str, int]]]:
        """The ready workers holding these items: {worker number: its keys}."""
        out: dict[int, list[tuple[str, int]]] = {}
        for member in self.ready():
            mine = [k for k in keys if k in member.assigned]
            if mine:
                out[member.number] = mine
        return out

    # -- what happened ---------------------------------------------------------------------
    def answered(self, number: int, results: Sequence[ItemResult]) -> list[ItemResult]:
        """Results worker ``number`` sent: those of items it holds (each released),
        and nothing from a worker that is no longer the holder."""
        member = self.members[number]
        taken = []
        for result in results:
            if member.assigned.pop(result.key, None) is not None:
                taken.append(result)
        return taken

    def lose(self, number: int) -> tuple[list[Item], bool]:
        """Worker ``number``'s actor is gone: its items go to the backlog (first in line).
        Returns them, and whether a new actor may take its place (then the member
        is ``STARTING`` again, one generation on)."""
        member = self.members[number]
        items = list(member.assigned.values())
        member.assigned.clear()
        self.backlog[:0] = items
        self.lost += 1
        member.node = None
        if self.replacements_left > 0:
            self.replacements_left -= 1
            member.generation += 1
            member.state = State.STARTING
            return items, True
        member.state = State.LOST
        return items, False

    def alive(self) -> bool:
        """Whether any worker runs or may still start."""
        return any(m.state is not State.LOST for m in self.members)

    def counts(self) -> tuple[int, int]:
        """(ready workers, worker places)."""
        return len(self.ready()), len(self.members)
