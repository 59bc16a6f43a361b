"""One worker: runs stage chains over work items on one event loop (no Ray here).

The Ray actor (``factory.engine.pool.WorkerActor``) is a thin shell around this
class, and tests drive it directly. The driver hands a worker items
(``submit``) and long-polls their results (``collect``); each item runs as its own
task, so a result goes back the moment its item is done, never behind a slower
neighbour (the Ray Data engine handed a batch on only when its slowest row was
done). LLM stages bound their requests with their own slots; a chain whose LLM
stage feeds a batched backend (a batch API) runs each submitted chunk as one
batch instead, since that backend wants many requests per call.

I/O before CPU: a worker's loop reads answers, frees their slots and writes the
requests those slots wake, and it runs the CPU stages (parse, repair, validate, label:
about a millisecond a row). A CPU stage that runs while an answer waits unread or a
woken request waits unwritten leaves a server slot idle that long, and answers arrive
in bursts. So CPU stages wait their turn at the worker's ``CpuGate``: one row at a
time, once nothing else is ready to run on the loop.

``stop(reason)`` refuses every request not sent yet: its row comes back
``unissued`` with that reason (a budget cap), or the item comes back cancelled
(``NOT_NEEDED``: the run reached its target and the item was never started).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

from factory.engine.rows import Row
from factory.engine.stages.base import (
    COLUMNS,
    HURRY,
    NOT_NEEDED,
    OK,
    UNISSUED,
    Stage,
    StageSpec,
)
from factory.engine.work import Item, ItemResult

__all__ = ["NOT_NEEDED", "CpuGate", "Worker", "freeze_heap"]
COLLECT_LINGER_S = 0.005  # after the first result, wait this long for more to share a reply
# Loop turns a row's CPU stages wait at least. A woken request needs three to reach the
# socket (its slot's wake-up, the request task, aiohttp's body writer: counted in a run's
# actors, 2026-11-26); one more is margin. On a loop whose ready queue cannot be read
# (not CPython's asyncio) this is all the gate waits.
CPU_MIN_TURNS = 4
# ... and at most: under a stream of I/O that never leaves the loop idle, CPU work still
# moves (one row per this many turns).
CPU_MAX_TURNS = 64


class Worker:
    """Chains of stages by name, built on first use, run over submitted items.

    Args:
        chains: ``{name: [(build, args), ...]}``; ``build(*args)`` makes a stage.
        health: called by ``collect`` for the report it sends with results (the LLM
            endpoints' state); default none.
    """

    def __init__(
        self,
        chains: Mapping[str, Sequence[StageSpec]] | None = None,
        *,
        health: Callable[[], dict[str, Any]] | None = None,
    ) -> None:
        self._specs: dict[str, list[StageSpec]] = {k: list(v) for k, v in (chains or {}).items()}
        self._built: dict[str, list[Stage]] = {}
        self._done: list[ItemResult] = []
        self._ready: asyncio.Event | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._health = health
        self._halted: asyncio.Event | None = None
        self._hurry: dict[tuple[str, int], asyncio.Event] = {}  # items running, by key
        self.stopped: str | None = None
        self.started = 0  # items started, for tests and stats
        self._cpu = CpuGate()

    # -- chains ---------------------------------------------------------------------------
    def add_chain(self, name: str, specs: Sequence[StageSpec]) -> None:
        """Declare (or replace) a chain; it is built when an item first needs it."""
        self._specs[name] = list(specs)
        old = self._built.pop(name, None)
        for stage in old or ():
            with contextlib.suppress(Exception):
                stage.close()

    def chain(self, name: str) -> list[Stage]:
        if name not in self._built:
            if name not in self._specs:
                raise KeyError(f"no chain {name!r}; declared: {sorted(self._specs)}")
            stages = [build(*args) for build, args in self._specs[name]]
            for stage in stages:
                stage.admission = self.admission
                if hasattr(stage, "halted"):
                    stage.halted = self._halt_event()
            self._built[name] = stages
        return self._built[name]

    def stages(self) -> list[Stage]:
        return [s for chain in self._built.values() for s in chain]

    # -- admission: may a request go out? -------------------------------------------------
    def admission(self) -> str | None:
        """Why no new request may start now (the stop reason), or None."""
        return self.stopped

    def stop(self, reason: str) -> None:
        """Refuse every request not sent yet (``reason``: a cap, or ``NOT_NEEDED``); rows
        waiting to retry give up now (``Halt``)."""
        self.stopped = reason
        self._halt_event().set()

    def resume(self) -> None:
        self.stopped = None
        if self._halted is not None:
            self._halted.clear()

    def _halt_event(self) -> asyncio.Event:
        if self._halted is None:
            self._halted = asyncio.Event()
        return self._halted

    def hurry(self, keys: Sequence[tuple[str, int]]) -> None:
        """The driver waits on these items (later results are held behind them): their
        retries stop waiting out the backoff's jitter (``HURRY``). Unknown keys (done
        meanwhile) are ignored."""
        for key in keys:
            event = self._hurry.get(tuple(key))  # type: ignore[arg-type]  # Ray may send lists
            if event is not None:
                event.set()

    # -- items ----------------------------------------------------------------------------
    def _event(self) -> asyncio.Event:
        if self._ready is None:
            self._ready = asyncio.Event()
        return self._ready

    async def submit(self, items: Sequence[Item]) -> int:
        """Start ``items``; returns how many were taken."""
        if not items:
            return 0
        self._event()
        by_chain: dict[str, list[Item]] = {}
        for item in items:
            by_chain.setdefault(item.chain, []).append(item)
        for name, group in by_chain.items():
            chain = self.chain(name)
            if any(getattr(getattr(s, "backend", None), "batched", False) for s in chain):
                self._start(self._run_batch(chain, group))
            else:
                for item in group:
                    self._start(self._run_one(chain, item))
        self.started += len(items)
        return len(items)

    def _start(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _finish(self, item: Item, rows: list[dict[str, Any]]) -> None:
        cancelled = (
            self.stopped == NOT_NEEDED
            and len(rows) == 1
            and rows[0].get("status") == UNISSUED
            and rows[0].get("reason") == NOT_NEEDED
        )
        # where rows become typed: what the stages made, every column present (Row)
        typed = cast(list[Row], [] if cancelled else rows)
        self._done.append(ItemResult(item.stream, item.index, typed, cancelled))
        self._event().set()

    async def _run_one(self, chain: list[Stage], item: Item) -> None:
        rows = [start_row(item)]
        HURRY.set(self._hurry.setdefault(item.key, asyncio.Event()))  # this task's context
        try:
            for is_async, group in itertools.groupby(chain, key=lambda s: s.is_async):
                if is_async:
                    for stage in group:
                        rows = await run_stage(stage, rows)
                    continue
                async with self._cpu:  # a run of CPU stages: one turn at the gate for all
                    for stage in group:
                        rows = await run_stage(stage, rows)
        finally:
            self._hurry.pop(item.key, None)
            self._finish(item, rows)

    async def _run_batch(self, chain: list[Stage], items: list[Item]) -> None:
        """One chunk as one batch (a batched backend wants them together); rows keep
        their item through ``_item`` so each result goes back under its own key."""
        rows = []
        for item in items:
            row = start_row(item)
            row["_item"] = item.index
            rows.append(row)
        try:
            for stage in chain:
                if stage.is_async:
                    rows = await stage.arun_rows(rows)
                else:
                    rows = stage.run_rows(rows)
        finally:
            by_index: dict[int, list[dict[str, Any]]] = {i.index: [] for i in items}
            for row in rows:
                by_index[row.pop("_item")].append(row)
            for item in items:
                self._finish(item, by_index[item.index])

    async def collect(self, max_wait: float) -> tuple[list[ItemResult], dict[str, Any]]:
        """Results finished since the last call: waits up to ``max_wait`` s for the first,
        then a moment for others, so one reply carries a burst."""
        ready = self._event()
        if not self._done:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(ready.wait(), max_wait)
            if self._done:
                await asyncio.sleep(COLLECT_LINGER_S)
        out, self._done = self._done, []
        ready.clear()
        return out, (self._health() if self._health is not None else {})

    @property
    def busy(self) -> int:
        """Items started and not finished."""
        return len(self._tasks)

    async def aclose(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(BaseException):
                await task
        for stage in self.stages():
            with contextlib.suppress(Exception):
                await stage.aclose()


def freeze_heap() -> None:
    """Collect once, then move every object alive now out of the cyclic collector's view
    (``gc.freeze``). A worker actor calls it once it is set up: what lives for the whole
    run in its process (Ray, pyarrow, aiohttp, the factory: ~136k objects) is
    then never walked again, and a full collection, which the allocations of hundreds of
    answers a second trigger every few seconds, pauses the loop for what the run
    allocated instead of ~70 ms, during which no freed slot is refilled."""
    import gc

    gc.collect()
    gc.freeze()


class CpuGate:
    """Where a worker's CPU stages wait: one row at a time (first come, first served),
    each once the event loop has nothing else ready to run, so reading answers and
    writing the requests they wake always goes first (I/O before CPU).

    Measured (a 3,000-call run at a fixed 200 ms, C = 64, four alternating pairs against
    a fixed four turns before every row's CPU stages): 16.4-18.2 idle slot-seconds at the
    server against 18.6-19.8; the start, the middle and the end of the run all gain.
    """

    def __init__(self, min_turns: int = CPU_MIN_TURNS, max_turns: int = CPU_MAX_TURNS) -> None:
        self.min_turns, self.max_turns = min_turns, max_turns
        self._lock: asyncio.Lock | None = None  # made on the loop that first uses it

    async def __aenter__(self) -> None:
        if self._lock is None:
            self._lock = asyncio.Lock()
        await self._lock.acquire()
        try:
            await until_idle(self.min_turns, self.max_turns)
        except BaseException:
            self._lock.release()
            raise

    async def __aexit__(self, *exc: object) -> None:
        assert self._lock is not None
        self._lock.release()


async def until_idle(min_turns: int, max_turns: int) -> None:
    """Yield to the loop at least ``min_turns`` times, then until nothing else is ready
    to run (at most ``max_turns``).

    Each yield is a turn of the loop, which polls its sockets first: an answer that came
    in, and each step of the request it wakes, is a ready callback, so the caller waits
    until the I/O has run its course. Reads CPython's ready queue (``loop._ready``); on a
    loop without one it waits ``min_turns``.
    """
    ready = getattr(asyncio.get_running_loop(), "_ready", None)
    for turn in range(1, max_turns + 1):
        await asyncio.sleep(0)
        if turn >= min_turns and not ready:
            return


def start_row(item: Item) -> dict[str, Any]:
    """The first stage's row: every column, status ok, the item's fields on top."""
    row: dict[str, Any] = dict.fromkeys(COLUMNS)
    row["status"] = OK
    row.update(item.row)
    return row


async def run_stage(stage: Stage, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One stage over an item's rows (a stage may turn one row into several)."""
    out: list[dict[str, Any]] = []
    for row in rows:
        result = await stage.arun_one(row) if stage.is_async else stage.run_one(row)
        if isinstance(result, list):
            out.extend(result)
        else:
            out.append(result)
    return out
