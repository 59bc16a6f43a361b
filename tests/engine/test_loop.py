"""The one driver loop, without Ray: a toy job on in-process workers (``LocalPool``)."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest

from factory.engine.ledger import Caps, Ledger
from factory.engine.loop import Bar, Declaration, drive
from factory.engine.pool import LocalPool
from factory.engine.stages.base import OK, Stage
from factory.engine.work import Item, ItemResult
from factory.engine.worker import NOT_NEEDED


class FakeLLM(Stage):
    """A call that takes a random time, costs 0.1, and keeps ``k % reject_every`` out."""

    name = "amplify"
    requires = ("call_index",)

    def __init__(self, seed: int, reject_every: int = 0) -> None:
        self.rng = random.Random(seed)
        self.reject_every = reject_every

    async def aprocess(self, row: dict[str, Any]) -> dict[str, Any]:
        why = self.admission() if self.admission else None
        if why is not None:
            row.update(status="unissued", stage=self.name, reason=why, llm_stage=self.name)
            return row
        await asyncio.sleep(self.rng.random() * 0.01)
        k = int(row["call_index"])
        row.update(llm_stage=self.name, cost_usd=0.1, paid_usd=0.1, calls=1, completion="c")
        if self.reject_every and k % self.reject_every == 0:
            row.update(status="rejected", reason="bad", stage="postprocess")
        else:
            row["output"] = f"row-{k}"
        return row


class Planner:
    def __init__(self, target: int) -> None:
        self.target = target
        self.issued = 0
        self.accepted: list[str] = []
        self.seen: list[int] = []

    @property
    def finished(self) -> bool:
        return len(self.accepted) >= self.target

    @property
    def stopped_by(self) -> str | None:
        return None

    def issue(self, room: int, llm_room: int) -> list[Item]:
        n = min(room, llm_room, self.target - len(self.accepted))
        items = [
            Item("calls", k, "c", {"call_index": k}, llm=True)
            for k in range(self.issued, self.issued + n)
        ]
        self.issued += len(items)
        return items

    def wanted(self, result: ItemResult) -> bool:
        return True

    def observe(self, result: ItemResult) -> None:
        self.seen.append(result.index)

    def bars(self) -> list[Bar]:
        return [Bar("accepted", len(self.accepted), self.target)]


class Sink:
    stop_reason = None

    def __init__(self, planner: Planner) -> None:
        self.planner = planner
        self.rows: list[dict[str, Any]] = []

    def arrived(self, result: ItemResult) -> None:
        pass

    def add(self, row: dict[str, Any], stream: str) -> str:
        if row["status"] == "unissued":
            return "unissued"
        self.rows.append(row)
        if row["status"] != OK:
            return "rejected"
        if self.planner.finished:
            return "surplus"
        self.planner.accepted.append(row["output"])
        return "accepted"


def _run(seed: int, *, target: int = 40, caps: Caps | None = None, reject_every: int = 0):
    planner = Planner(target)
    sink = Sink(planner)
    pool = LocalPool({"c": [(FakeLLM, (seed, reject_every))]}, workers=2, capacity=8)
    ledger = Ledger(caps)
    try:
        stopped = drive(Declaration("toy", {}, planner, sink), pool, ledger, poll_s=0.01)
    finally:
        pool.close()
    return planner, sink, ledger, stopped


def test_results_are_used_in_call_order_however_they_race() -> None:
    runs = [_run(seed, reject_every=7) for seed in (1, 2, 3)]
    for planner, _, ledger, stopped in runs:
        assert stopped is None and planner.seen == sorted(planner.seen)
        assert len(planner.accepted) == 40
        t = ledger.totals()
        assert t["total"] == t["accepted"] + t["surplus"] + t["rejected"] + t["failed"]
        assert t["accepted"] == 40 and t["rejected"] >= 6
    # the same rows, whatever the timing: the first 40 accepted calls in call order
    assert runs[0][0].accepted == runs[1][0].accepted == runs[2][0].accepted


def test_a_cap_stops_new_calls_and_counts_the_refused_ones_unissued() -> None:
    planner, _, ledger, stopped = _run(5, target=100, caps=Caps(max_cost_usd=1.0))
    assert stopped == "max_cost_usd" and ledger.stopped_by == "max_cost_usd"
    # at most the calls in flight (2 workers x 8) overshoot the cap
    assert 1.0 <= ledger.cost_usd <= 1.0 + 16 * 0.1 + 1e-9
    assert planner.seen == sorted(planner.seen) == list(range(planner.issued))
    assert ledger.totals()["accepted"] == len(planner.accepted) < 100


def test_max_calls_is_never_exceeded() -> None:
    planner, _, ledger, stopped = _run(6, target=100, caps=Caps(max_calls=25))
    assert stopped == "max_calls" and ledger.calls == 25 == planner.issued


def test_a_target_reached_with_the_last_call_the_cap_allows_is_not_a_cap_stop() -> None:
    planner, _, ledger, stopped = _run(7, target=25, caps=Caps(max_calls=25))
    assert ledger.calls == 25 and planner.issued == 25
    assert stopped is None  # the run did what was asked: exit 0, not "stopped by cap"


def test_work_not_needed_when_the_target_is_reached_never_starts() -> None:
    """The planner ends with items still queued in the workers: those never go out and
    count nowhere (the worker answers them cancelled)."""
    from factory.engine.worker import Worker

    async def scenario() -> list[ItemResult]:
        worker = Worker({"c": [(FakeLLM, (0,))]})
        worker.stop(NOT_NEEDED)
        await worker.submit([Item("calls", k, "c", {"call_index": k}, llm=True) for k in range(3)])
        got: list[ItemResult] = []
        while len(got) < 3:
            got += (await worker.collect(1.0))[0]
        await worker.aclose()
        return got

    got = asyncio.run(scenario())
    assert all(r.cancelled and r.rows == [] for r in got)


def test_a_request_a_freed_slot_woke_goes_out_before_the_answer_is_post_processed() -> None:
    """Answers come back in bursts: the requests their freed slots wake are written
    before any of the answers is post-processed (``worker.CpuGate``)."""
    from factory.engine.worker import Worker

    events: list[str] = []

    class OneSlot(Stage):
        name = "amplify"
        requires = ("call_index",)
        slot: asyncio.Semaphore | None = None

        async def aprocess(self, row: dict[str, Any]) -> dict[str, Any]:
            if self.slot is None:
                self.slot = asyncio.Semaphore(1)
            async with self.slot:
                for _ in range(2):  # like aiohttp: the request's task, then its body writer
                    await asyncio.sleep(0)
                events.append(f"sent {row['call_index']}")
                await asyncio.sleep(0.01)  # the answer
            return row

    class Post(Stage):
        name = "postprocess"
        requires = ("call_index",)

        def process(self, row: dict[str, Any]) -> dict[str, Any]:
            events.append(f"post {row['call_index']}")
            return {**row, "output": "x"}

    async def scenario() -> None:
        worker = Worker({"c": [(OneSlot, ()), (Post, ())]})
        await worker.submit([Item("calls", k, "c", {"call_index": k}, llm=True) for k in range(3)])
        got: list[ItemResult] = []
        while len(got) < 3:
            got += (await worker.collect(1.0))[0]
        await worker.aclose()

    asyncio.run(scenario())
    assert events == ["sent 0", "sent 1", "post 0", "sent 2", "post 1", "post 2"]


def test_cpu_work_waits_until_the_loop_has_nothing_else_ready() -> None:
    """I/O first: a gated CPU job runs after every step of a chain of callbacks in flight
    (an answer read, its slot freed, the next request written), however long the chain
    is, up to the gate's bound; under I/O that never stops it still runs after
    ``max_turns`` turns."""
    from factory.engine.worker import CpuGate

    async def scenario(io_steps: int, max_turns: int) -> list[str]:
        events: list[str] = []

        async def io() -> None:
            for k in range(io_steps):
                events.append(f"io {k}")
                await asyncio.sleep(0)

        async def cpu() -> None:
            async with CpuGate(min_turns=1, max_turns=max_turns):
                events.append("cpu")

        await asyncio.gather(cpu(), io())
        return events

    events = asyncio.run(scenario(io_steps=30, max_turns=64))
    assert events[-1] == "cpu" and len(events) == 31  # after all 30 steps, not after 1
    events = asyncio.run(scenario(io_steps=200, max_turns=10))
    assert 8 <= events.index("cpu") <= 12  # bounded: the I/O did not starve it


def test_without_a_readable_ready_queue_the_gate_waits_its_minimum_turns(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On an event loop that is not CPython's asyncio (no ``_ready``), the gate cannot see
    pending I/O: it waits ``min_turns`` and no longer."""
    from factory.engine import worker
    from factory.engine.worker import CpuGate

    class Opaque:  # what until_idle sees of the loop
        pass

    monkeypatch.setattr(worker.asyncio, "get_running_loop", Opaque)

    async def scenario() -> list[str]:
        events: list[str] = []

        async def io() -> None:
            for k in range(30):
                events.append(f"io {k}")
                await asyncio.sleep(0)

        async def cpu() -> None:
            async with CpuGate(min_turns=4, max_turns=64):
                events.append("cpu")

        await asyncio.gather(cpu(), io())
        return events

    events = asyncio.run(scenario())
    assert 3 <= events.index("cpu") <= 6  # after its 4 turns, long before the 30 steps


def test_cpu_jobs_pass_the_gate_one_at_a_time_in_arrival_order() -> None:
    from factory.engine.worker import CpuGate

    async def scenario() -> list[str]:
        gate, events = CpuGate(min_turns=1, max_turns=4), []

        async def job(name: str) -> None:
            async with gate:
                events.append(f"{name} in")
                await asyncio.sleep(0)  # a job that yields inside still holds the gate
                events.append(f"{name} out")

        await asyncio.gather(job("a"), job("b"), job("c"))
        return events

    assert asyncio.run(scenario()) == ["a in", "a out", "b in", "b out", "c in", "c out"]


@pytest.mark.parametrize("stream_count", [1, 2])
def test_rows_of_one_item_stay_together_and_in_order(stream_count: int) -> None:
    class Fan(Stage):
        name = "fan"
        requires = ("call_index",)

        def process(self, row: dict[str, Any]) -> list[dict[str, Any]]:  # type: ignore[override]
            k = int(row["call_index"])
            return [{**row, "output": f"{k}.{i}"} for i in range(k % 3 + 1)]

    class P(Planner):
        def issue(self, room: int, llm_room: int) -> list[Item]:
            if self.issued >= 20:
                return []
            n = min(room, 20 - self.issued)
            items = [
                Item(f"s{k % stream_count}", k // stream_count, "c", {"call_index": k})
                for k in range(self.issued, self.issued + n)
            ]
            self.issued += n
            return items

        @property
        def finished(self) -> bool:
            return self.issued >= 20 and len(self.seen) == 20

    planner = P(0)
    sink = Sink(planner)
    pool = LocalPool({"c": [(Fan, ())]}, workers=2, capacity=4)
    try:
        drive(Declaration("fan", {}, planner, sink), pool, Ledger(), poll_s=0.01)
    finally:
        pool.close()
    outputs = [r["output"] for r in sink.rows]
    assert len(outputs) == sum(k % 3 + 1 for k in range(20))
    for k in range(20):  # an item's rows are contiguous
        mine = [i for i, o in enumerate(outputs) if o.split(".")[0] == str(k)]
        assert mine == list(range(mine[0], mine[0] + len(mine)))


class BackoffFirst(FakeLLM):
    """Call 0 sleeps in a 60 s backoff (as after a failed attempt), the others do not."""

    async def aprocess(self, row: dict[str, Any]) -> dict[str, Any]:
        from factory.engine.stages.llm_stage import _pause

        if int(row["call_index"]) == 0:
            await _pause(60.0)
        return await super().aprocess(row)


def test_the_item_later_results_wait_for_is_hurried_out_of_its_backoff() -> None:
    """Rows are used in call order, so every later row waits for call 0: the driver
    hurries it and its backoff ends early; the order of the rows is unchanged."""
    import time

    planner = Planner(20)
    pool = LocalPool({"c": [(BackoffFirst, (3,))]}, workers=2, capacity=8)
    started = time.monotonic()
    try:
        stopped = drive(Declaration("toy", {}, planner, Sink(planner)), pool, Ledger(), poll_s=0.01)
    finally:
        pool.close()
    assert stopped is None and planner.seen == sorted(planner.seen)
    assert planner.accepted[0] == "row-0" and len(planner.accepted) == 20
    assert time.monotonic() - started < 30.0  # not the 60 s backoff


def test_an_item_is_hurried_once_after_it_held_back_results_for_a_while() -> None:
    from factory.engine.loop import HURRY_AFTER_S, _hurry

    class Recorder:
        def __init__(self) -> None:
            self.calls: list[list[tuple[str, int]]] = []

        def hurry(self, keys: list[tuple[str, int]]) -> None:
            self.calls.append(list(keys))

    pool = Recorder()
    state = _hurry(pool, [("calls", 3)], {}, 100.0)  # type: ignore[arg-type]
    state = _hurry(pool, [("calls", 3)], state, 100.0 + HURRY_AFTER_S / 2)  # type: ignore[arg-type]
    assert pool.calls == []  # a moment's wait in a healthy run: nothing to hurry
    state = _hurry(pool, [("calls", 3), ("seeds", 0)], state, 100.0 + HURRY_AFTER_S)  # type: ignore[arg-type]
    assert pool.calls == [[("calls", 3)]]
    state = _hurry(pool, [("calls", 3), ("seeds", 0)], state, 100.0 + 3 * HURRY_AFTER_S)  # type: ignore[arg-type]
    assert pool.calls == [[("calls", 3)], [("seeds", 0)]]  # each once
    state = _hurry(pool, [("calls", 4)], state, 200.0)  # type: ignore[arg-type]
    assert state == {("calls", 4): 200.0}  # released ones are forgotten


def test_freeze_heap_takes_what_lives_now_out_of_the_collectors_view() -> None:
    import gc

    from factory.engine.worker import freeze_heap

    class Cycle:
        def __init__(self) -> None:
            self.me = self

    gc.collect()
    before = len(gc.get_objects())
    Cycle()  # garbage in a cycle: collected first, never frozen
    try:
        freeze_heap()
        assert gc.get_freeze_count() >= before - 100
        assert not [o for o in gc.get_objects() if isinstance(o, Cycle)]
        assert len(gc.get_objects()) < 1000  # what a full collection still walks
    finally:
        gc.unfreeze()  # the test process goes on as it was


class SlotLLM(Stage):
    """A call that holds one of two slots for ``seconds``; the admission is read once a
    slot is taken (as ``LLMStage.call`` does), so a stop refuses the rows still queued."""

    name = "amplify"
    requires = ("call_index",)

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.on_the_wire = 0
        self._slots: asyncio.Semaphore | None = None

    async def aprocess(self, row: dict[str, Any]) -> dict[str, Any]:
        self._slots = self._slots or asyncio.Semaphore(2)
        async with self._slots:
            why = self.admission() if self.admission else None
            if why is not None:
                row.update(status="unissued", stage=self.name, reason=why, llm_stage=self.name)
                return row
            self.on_the_wire += 1
            await asyncio.sleep(self.seconds)
            row.update(llm_stage=self.name, completion="c", output=f"row-{row['call_index']}")
        return row


def _two_on_the_wire(seconds: float) -> tuple[LocalPool, SlotLLM]:
    import time

    pool = LocalPool({"c": [(SlotLLM, (seconds,))]}, workers=1, capacity=8)
    pool.submit([Item("calls", k, "c", {"call_index": k}, llm=True) for k in range(6)])
    stage = pool.workers[0].chain("c")[0]
    assert isinstance(stage, SlotLLM)
    deadline = time.monotonic() + 30
    while stage.on_the_wire < 2:  # a loaded machine takes its time to start them
        assert time.monotonic() < deadline
        time.sleep(0.005)
    return pool, stage


def test_winding_down_lets_the_calls_on_the_wire_finish_and_refuses_the_rest() -> None:
    """Issue 33: Ctrl-C and SIGTERM closed the pool at once, cancelling the requests in
    flight (a provider bills them; the resume sent them again). ``wind_down`` stops
    issuing, waits for what is on the wire, and hands every result to the sink
    (``Sink.arrived``: the answers the cache refused are kept)."""
    from factory.engine.loop import wind_down

    pool, stage = _two_on_the_wire(0.2)
    arrived: list[ItemResult] = []
    sink = type("S", (), {"arrived": lambda self, r: arrived.append(r)})()
    try:
        came = wind_down(pool, sink, "interrupted", grace_s=30.0, poll_s=0.01)
        assert pool.in_flight == 0
    finally:
        pool.close()
    rows = [row for result in came for row in result.rows]
    assert sorted(r["output"] for r in rows if r.get("completion")) == ["row-0", "row-1"]
    refused = [r for r in rows if r["status"] == "unissued"]
    assert len(refused) == 4 and {r["reason"] for r in refused} == {"interrupted"}
    assert arrived == came and stage.on_the_wire == 2


def test_winding_down_waits_no_longer_than_its_grace() -> None:
    import time

    from factory.engine.loop import wind_down

    pool, _ = _two_on_the_wire(600.0)
    sink = type("S", (), {"arrived": lambda self, r: None})()
    try:
        started = time.monotonic()
        wind_down(pool, sink, "interrupted", grace_s=0.2, poll_s=0.01)
        assert time.monotonic() - started < 60  # the grace, never the calls' 600 s
        # two on the wire, four queued behind their slots: the close that follows cuts
        # them, and the resume sends them
        assert pool.in_flight == 6
    finally:
        pool.close()


class TwoPhases(Planner):
    """Phase ``a`` to ``target`` (issuing ahead of it), then, once everything it issued
    came back, phase ``b`` to ``then``: finished for a while, then not (a mixed recipe's
    parts, ``MixPlanner``)."""

    def __init__(self, target: int, then: int) -> None:
        super().__init__(target)
        self.then = then
        self.phase = "a"
        self.out = 0
        self.b_issued = 0
        self.issued_while_a_out = 0

    @property
    def finished(self) -> bool:
        return (self.phase == "a" and len(self.accepted) >= self.target) or (
            self.phase == "b" and len(self.accepted) >= self.target + self.then
        )

    def issue(self, room: int, llm_room: int) -> list[Item]:
        if self.phase == "a":
            n = min(room, llm_room, 2 * self.target - self.issued)  # ahead of the target
            items = [
                Item("a", k, "c", {"call_index": k}, llm=True)
                for k in range(self.issued, self.issued + n)
            ]
            self.issued += n
        else:
            n = min(room, llm_room, self.then - self.b_issued)
            k0 = self.b_issued
            items = [
                Item("b", k, "c", {"call_index": 1000 + k}, llm=True) for k in range(k0, k0 + n)
            ]
            self.b_issued += n
        self.out += len(items)
        return items

    def wanted(self, result: ItemResult) -> bool:
        self.out -= 1
        return True

    def observe(self, result: ItemResult) -> None:
        if self.phase == "a" and len(self.accepted) >= self.target and self.out == 0:
            self.phase = "b"


def test_a_planner_finished_for_a_while_goes_on_once_its_items_came_back() -> None:
    """The loop stops the workers' unsent items when the planner is finished with items
    out, and resumes them when the planner has more once those came back."""
    planner = TwoPhases(10, then=5)
    sink = Sink(planner)
    pool = LocalPool({"c": [(FakeLLM, (3, 0))]}, workers=2, capacity=8)
    ledger = Ledger()
    try:
        stopped = drive(Declaration("toy", {}, planner, sink), pool, ledger, poll_s=0.01)
    finally:
        pool.close()
    assert stopped is None and planner.phase == "b"
    assert len(planner.accepted) == 15  # phase b's calls went out after the stop was lifted
    assert all(r["output"] == f"row-{1000 + k}" for k, r in enumerate(sink.rows[-5:]))
