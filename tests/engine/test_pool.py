"""The workers as Ray actors: results come back as items finish, an actor keeps its slots
busy, a dead actor's items are issued again (``factory.engine.pool``)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

from factory.engine.pool import ActorPool
from factory.engine.stages.base import Stage
from factory.engine.work import Item, ItemResult

SLOTS = 24


class Gate(Stage):
    """Each item waits until ``SLOTS`` items of this actor wait together (or 2 s pass),
    then reports the most it saw at once: fewer items at once than ``SLOTS`` and the
    gate never opens, the peak stays below it (issue 8: Ray Data awaited 4 batches)."""

    name = "gate"
    requires = ()

    def __init__(self) -> None:
        self.waiting = 0
        self.peak = 0
        self.full = asyncio.Event()

    async def aprocess(self, row: dict[str, Any]) -> dict[str, Any]:
        self.waiting += 1
        self.peak = max(self.peak, self.waiting)
        if self.waiting >= SLOTS:
            self.full.set()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self.full.wait(), timeout=2.0)
        self.waiting -= 1
        return {**row, "message": str(self.peak)}


class Slow(Stage):
    """Item k takes k x 0.2 s: the first results must not wait for the last."""

    name = "slow"
    requires = ("call_index",)

    async def aprocess(self, row: dict[str, Any]) -> dict[str, Any]:
        await asyncio.sleep(0.2 * int(row["call_index"]))
        return row


class Backoff(Stage):
    """Item 0 sleeps in a minute-long retry backoff; the others answer at once."""

    name = "backoff"
    requires = ("call_index",)

    async def aprocess(self, row: dict[str, Any]) -> dict[str, Any]:
        from factory.engine.stages.llm_stage import _pause

        if int(row["call_index"]) == 0:
            await _pause(60.0)
        return row


def _drain(pool: ActorPool, n: int, timeout: float = 60) -> list[tuple[float, ItemResult]]:
    got: list[tuple[float, ItemResult]] = []
    deadline = time.monotonic() + timeout
    while len(got) < n and time.monotonic() < deadline:
        results, _ = pool.poll(0.5)
        got += [(time.monotonic(), r) for r in results]
    return got


def test_one_actor_keeps_as_many_items_going_as_it_holds(ray_session: Any) -> None:
    pool = ActorPool({"g": [(Gate, ())]}, actors=1, num_cpus=0.25, capacity=2 * SLOTS)
    try:
        pool.submit([Item("s", k, "g") for k in range(2 * SLOTS)])
        got = _drain(pool, 2 * SLOTS)
    finally:
        pool.close()
    assert len(got) == 2 * SLOTS
    assert max(int(r.rows[0]["message"]) for _, r in got) >= SLOTS


def test_results_come_back_as_items_finish(ray_session: Any) -> None:
    pool = ActorPool({"s": [(Slow, ())]}, actors=1, num_cpus=0.25, capacity=8)
    try:
        start = time.monotonic()
        pool.submit([Item("s", k, "s", {"call_index": k}) for k in range(8)])
        got = _drain(pool, 8)
    finally:
        pool.close()
    arrival = {r.index: t - start for t, r in got}
    assert sorted(arrival) == list(range(8))
    # item 0 is back long before item 7 (1.4 s): nothing waits for a slower neighbour
    assert arrival[0] < arrival[7] - 0.8


def test_items_ride_on_the_next_collect_call_or_go_at_once_while_one_is_out(
    ray_session: Any,
) -> None:
    """The refill after a reply goes out with the actor's next ``collect`` (one Ray call,
    not two); items given while a ``collect`` is out go at once. None is lost either way."""
    pool = ActorPool({"s": [(Slow, ())]}, actors=1, num_cpus=0.25, capacity=8)
    try:
        assert pool.wait_started(120) == 1  # a starting actor takes no item
        pool.submit([Item("s", k, "s", {"call_index": 1}) for k in range(3)])  # 0.2 s each
        assert not pool._submits and len(pool.slots[0].riding) == 3  # no call yet
        assert pool.poll(0.01)[0] == []  # the collect call takes them (none is done yet)
        assert not pool.slots[0].riding
        pool.submit([Item("s", 3, "s", {"call_index": 1})])  # a collect is out: at once
        assert len(pool._submits) == 1
        got = _drain(pool, 4)
    finally:
        pool.close()
    assert sorted(r.index for _, r in got) == [0, 1, 2, 3]


def test_a_hurried_item_leaves_its_backoff_on_its_actor(ray_session: Any) -> None:
    """The driver's hurry reaches the actor that holds the item (``ActorPool.hurry``)."""
    pool = ActorPool({"b": [(Backoff, ())]}, actors=2, num_cpus=0.25, capacity=4)
    try:
        pool.submit([Item("s", k, "b", {"call_index": k}) for k in range(4)])
        first = _drain(pool, 3)
        pool.hurry([("s", 0), ("s", 99)])  # 99: never issued, ignored
        rest = _drain(pool, 1, timeout=30)
    finally:
        pool.close()
    assert sorted(r.index for _, r in first) == [1, 2, 3]
    assert [r.index for _, r in rest] == [0]  # not after the 60 s backoff


def test_the_actor_class_runs_a_worker_in_this_process_too() -> None:
    """``WorkerActor`` is a thin shell over ``Worker``: built and called here, without Ray
    (its watchdog sees no Ray worker and watches nothing), it submits, collects, takes a
    new chain, stops, resumes and shuts down as the actor does."""
    from factory.engine.pool import WorkerActor

    async def go() -> list[int]:
        actor = WorkerActor({"s": [(Slow, ())]}, None)
        assert actor._health() == {}  # no stage with a backend
        await actor.add_chain("t", [(Slow, ())])
        items = [Item("calls", k, "s" if k % 2 else "t", {"call_index": k}) for k in range(3)]
        assert await actor.submit(items) == 3
        got: list[ItemResult] = []
        deadline = time.monotonic() + 10
        while len(got) < 3 and time.monotonic() < deadline:
            results, _ = await actor.collect(0.5)
            got += results
        await actor.stop("a cap")
        await actor.resume()
        await actor.shutdown()
        return sorted(r.index for r in got)

    assert asyncio.run(go()) == [0, 1, 2]


def test_a_lost_worker_is_replaced_its_items_issued_again_and_calls_to_it_tolerated(
    ray_session: Any,
) -> None:
    """An actor gone mid-run (a node lost, OOM, ``ray kill``): a control call meeting it
    takes it as lost like a collect call does (issue 33: ``stop`` raised and ended the
    run), its items go to the other worker, a new actor takes its place, and every item
    comes back exactly once."""
    import pytest
    import ray

    notes: list[str] = []
    pool = ActorPool({"s": [(Slow, ())]}, actors=2, num_cpus=0.25, capacity=4, notify=notes.append)
    try:
        assert pool.wait_started(120) == 2
        pool.submit([Item("s", k, "s", {"call_index": 2}) for k in range(8)])  # 0.4 s each
        pool.poll(0.01)  # the items ride out on the collect calls
        victim = pool.slots[0].handle
        ray.kill(victim, no_restart=True)
        with pytest.raises(ray.exceptions.RayActorError):
            ray.get(victim.hurry.remote([]), timeout=60)
        pool.stop("a cap")  # meets the dead actor: no error, the worker is lost
        assert pool.slots[0].handle is not victim and pool.roster.counts() == (1, 2)
        pool.resume()
        got = _drain(pool, 8)
        assert pool.wait_started(120) == 2
    finally:
        pool.close()
    assert sorted(r.index for _, r in got) == list(range(8))
    assert any(n.startswith("worker 0 lost (it died on node") for n in notes), notes
    assert any(n.startswith("worker 0 started on node") for n in notes), notes
