"""The run's workers: Ray actors around ``factory.engine.worker.Worker`` (thin adapter).

Why actors and not a Ray Data execution per round: the driver loop issues work as
results come back, one item at a time, with no round to drain and no block to
wait for (issue 22). An actor takes items (``submit``, fire and forget) and is
long-polled for results (``collect``: it answers as soon as one item is done).
The driver keeps one ``collect`` outstanding per actor and waits on all of them
at once, so a result reaches the driver a few milliseconds after its item ends.
Items given to an actor whose ``collect`` has just answered ride on its next
``collect`` (one Ray call, not two, per refill: the refill after a reply is the
common case, and each Ray call costs the driver, the actor and Ray's own threads
CPU on a machine the LLM server may share).

What a worker was given but has not answered is remembered here per actor: if
the actor dies (OOM, a node lost, ``ray kill``), Ray restarts it, this module
gives it its chains again and re-submits those items (answers already stored in
the response cache cost nothing the second time), so nothing is lost.

``LocalPool`` runs the same workers in this process (one event loop thread):
the loop's tests and small runs use it without Ray.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NoReturn, Protocol

from factory.engine.stages.base import StageSpec
from factory.engine.work import Item, ItemResult
from factory.engine.worker import Worker, freeze_heap

__all__ = ["ActorPool", "LocalPool", "Pool", "WorkerActor"]

log = logging.getLogger(__name__)

COLLECT_WAIT_S = 1.0  # a collect call returns after this long even with nothing done


class Pool(Protocol):
    """What the driver loop needs of its workers."""

    def room(self) -> int: ...

    def submit(self, items: Sequence[Item]) -> None: ...

    def poll(self, timeout: float) -> tuple[list[ItemResult], dict[int, dict[str, Any]]]: ...

    def hurry(self, keys: Sequence[tuple[str, int]]) -> None: ...

    def add_chain(self, name: str, specs: Sequence[StageSpec]) -> None: ...

    def stop(self, reason: str) -> None: ...

    def resume(self) -> None: ...

    @property
    def in_flight(self) -> int: ...

    def close(self) -> None: ...


class WorkerActor:
    """The Ray actor: a ``Worker`` that first ties itself to the driver's lifeline.

    Args:
        chains: the chains known at start (more come with ``add_chain``).
        lifeline: ``(host, port)`` of the driver's lifeline socket
            (``factory.engine.watchdog``), or None.
    """

    def __init__(
        self, chains: Mapping[str, Sequence[StageSpec]], lifeline: tuple[str, int] | None
    ) -> None:
        from factory.engine import watchdog

        watchdog.start(lifeline=lifeline)  # no request leaves once the driver is gone
        self.worker = Worker(chains, health=self._health)
        freeze_heap()

    def _health(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for stage in self.worker.stages():
            backend = getattr(stage, "backend", None)
            health = getattr(backend, "health", None)
            if health is not None:
                out.update(health())
        return out

    async def submit(self, items: list[Item]) -> int:
        return await self.worker.submit(items)

    async def collect(
        self, max_wait: float, items: list[Item] | None = None
    ) -> tuple[list[ItemResult], dict[str, Any]]:
        """Start ``items`` (if any), then wait for results (``Worker.collect``)."""
        if items:
            await self.worker.submit(items)
        return await self.worker.collect(max_wait)

    async def hurry(self, keys: list[tuple[str, int]]) -> None:
        self.worker.hurry(keys)

    async def add_chain(self, name: str, specs: list[StageSpec]) -> None:
        self.worker.add_chain(name, specs)

    async def stop(self, reason: str) -> None:
        self.worker.stop(reason)

    async def resume(self) -> None:
        self.worker.resume()

    async def shutdown(self) -> None:
        await self.worker.aclose()


@dataclass
class _Slot:
    """The driver's view of one actor."""

    handle: Any
    assigned: dict[tuple[str, int], Item] = field(default_factory=dict)
    collecting: Any = None  # the outstanding collect call's ObjectRef
    alive: bool = True
    riding: list[Item] = field(default_factory=list)  # go out with the next collect call


class ActorPool:
    """``actors`` Ray actors running the given chains; at most ``capacity`` items each.

    Args:
        chains: chains every actor knows from the start.
        actors: how many.
        num_cpus: each actor's CPU reservation (fractional on a small machine).
        capacity: items one actor holds at once (its LLM slots and a queue as deep).
        lifeline: the driver's lifeline address, passed to each actor.
        max_restarts: how often Ray restarts a dead actor before the run fails.
    """

    def __init__(
        self,
        chains: Mapping[str, Sequence[StageSpec]],
        *,
        actors: int,
        num_cpus: float,
        capacity: int,
        lifeline: tuple[str, int] | None = None,
        max_restarts: int = 3,
    ) -> None:
        import ray

        self._ray = ray
        remote = ray.remote(WorkerActor).options(
            num_cpus=num_cpus,
            max_restarts=max_restarts,
            max_task_retries=0,
            max_concurrency=max(1000, 4 * capacity),
        )
        self.capacity = capacity
        self._chains: dict[str, list[StageSpec]] = {k: list(v) for k, v in chains.items()}
        self._stop: str | None = None
        self.slots = [_Slot(remote.remote(dict(self._chains), lifeline)) for _ in range(actors)]
        self._submits: list[Any] = []
        self.restarts = 0

    # -- work -----------------------------------------------------------------------------
    @property
    def in_flight(self) -> int:
        return sum(len(s.assigned) for s in self.slots)

    def room(self) -> int:
        return sum(max(0, self.capacity - len(s.assigned)) for s in self.slots if s.alive)

    def submit(self, items: Sequence[Item]) -> None:
        """Hand items to the least loaded actors (each up to its capacity)."""
        live = [s for s in self.slots if s.alive]
        if not live:
            raise RuntimeError("every worker of the run died")
        chunks: dict[int, list[Item]] = {}
        for item in items:
            slot = min(live, key=lambda s: len(s.assigned))
            slot.assigned[item.key] = item
            chunks.setdefault(id(slot), []).append(item)
        for slot in live:
            chunk = chunks.get(id(slot))
            if not chunk:
                continue
            if slot.collecting is None:  # its next collect call goes out with them
                slot.riding.extend(chunk)
            else:
                self._submits.append(slot.handle.submit.remote(chunk))

    def poll(self, timeout: float) -> tuple[list[ItemResult], dict[int, dict[str, Any]]]:
        """Results that came back within ``timeout`` s (all that are ready), and each
        replying actor's health report (by actor number)."""
        ray = self._ray
        self._reap_submits()
        for slot in self.slots:
            if slot.alive and slot.collecting is None:
                riding, slot.riding = slot.riding, []
                slot.collecting = slot.handle.collect.remote(COLLECT_WAIT_S, riding or None)
        waiting = {s.collecting: s for s in self.slots if s.collecting is not None}
        if not waiting:
            return [], {}
        ready, _ = ray.wait(list(waiting), num_returns=1, timeout=timeout)
        if ready:
            more, _ = ray.wait(list(waiting), num_returns=len(waiting), timeout=0)
            ready = list(dict.fromkeys([*ready, *more]))
        results: list[ItemResult] = []
        health: dict[int, dict[str, Any]] = {}
        for ref in ready:
            slot = waiting[ref]
            slot.collecting = None
            try:
                got, report = ray.get(ref)
            except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError) as exc:
                self._lost(slot, exc)
                continue
            except ray.exceptions.RayTaskError as exc:
                _stage_error(exc)
            for result in got:
                slot.assigned.pop(result.key, None)
            results.extend(got)
            if report:
                health[self.slots.index(slot)] = report
        return results, health

    def hurry(self, keys: Sequence[tuple[str, int]]) -> None:
        """Tell the actors holding these items that the driver waits on them."""
        for slot in self.slots:
            mine = [k for k in keys if k in slot.assigned]
            if mine and slot.alive:
                self._submits.append(slot.handle.hurry.remote(mine))

    def _reap_submits(self) -> None:
        if not self._submits:
            return
        done, self._submits = self._ray.wait(
            self._submits, num_returns=len(self._submits), timeout=0
        )
        for ref in done:
            try:
                self._ray.get(ref)
            except (
                self._ray.exceptions.RayActorError,
                self._ray.exceptions.ActorUnavailableError,
            ):
                continue  # a dead actor shows on its collect call, which re-issues its items
            except self._ray.exceptions.RayTaskError as exc:
                _stage_error(exc)

    def _lost(self, slot: _Slot, exc: BaseException) -> None:
        """An actor died: give its work to its restarted self, or to the others."""
        ray = self._ray
        items = list(slot.assigned.values())  # the riding ones among them
        slot.assigned.clear()
        slot.riding.clear()
        self.restarts += 1
        log.warning(
            "a worker died (%s); %d of its items are issued again", type(exc).__name__, len(items)
        )
        try:  # a restarted actor needs the chains added since it started, and the stop
            ray.get([slot.handle.add_chain.remote(n, s) for n, s in self._chains.items()])
            if self._stop is not None:
                ray.get(slot.handle.stop.remote(self._stop))
        except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError):
            slot.alive = False
        if items:
            self.submit(items)

    # -- control --------------------------------------------------------------------------
    def add_chain(self, name: str, specs: Sequence[StageSpec]) -> None:
        self._chains[name] = list(specs)
        self._ray.get([s.handle.add_chain.remote(name, list(specs)) for s in self.slots if s.alive])

    def stop(self, reason: str) -> None:
        self._stop = reason
        self._ray.get([s.handle.stop.remote(reason) for s in self.slots if s.alive])

    def resume(self) -> None:
        self._stop = None
        self._ray.get([s.handle.resume.remote() for s in self.slots if s.alive])

    def close(self) -> None:
        """Close the workers' sessions and caches, then end the actors."""
        ray = self._ray
        refs = [s.handle.shutdown.remote() for s in self.slots if s.alive]
        with contextlib.suppress(Exception):
            ray.wait(refs, num_returns=len(refs), timeout=10)
        for slot in self.slots:
            with contextlib.suppress(Exception):
                ray.kill(slot.handle)


def _stage_error(exc: Any) -> NoReturn:
    """A stage that cannot be built (a recipe error only the actor finds, as a bad world
    size): nothing of that chain can ever finish, so the run ends with the stage's own
    error rather than waiting forever."""
    log.info("a worker could not build a stage. Traceback (in the worker):\n%s", exc)
    cause = exc.cause if isinstance(exc.cause, Exception) else exc
    raise cause from None


class LocalPool:
    """The same workers in this process: one event loop in a thread, no Ray."""

    def __init__(
        self, chains: Mapping[str, Sequence[StageSpec]], *, workers: int = 1, capacity: int = 64
    ) -> None:
        self.capacity = capacity
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self.workers = [Worker(chains) for _ in range(workers)]
        self._assigned: list[set[tuple[str, int]]] = [set() for _ in self.workers]

    def _call(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    @property
    def in_flight(self) -> int:
        return sum(len(a) for a in self._assigned)

    def room(self) -> int:
        return sum(max(0, self.capacity - len(a)) for a in self._assigned)

    def submit(self, items: Sequence[Item]) -> None:
        chunks: dict[int, list[Item]] = {}
        for item in items:  # as the actor pool does: the least loaded worker, one chunk each
            i = min(range(len(self.workers)), key=lambda j: len(self._assigned[j]))
            self._assigned[i].add(item.key)
            chunks.setdefault(i, []).append(item)
        for i, chunk in chunks.items():
            self._call(self.workers[i].submit(chunk))

    def poll(self, timeout: float) -> tuple[list[ItemResult], dict[int, dict[str, Any]]]:
        deadline = time.monotonic() + timeout
        results: list[ItemResult] = []
        while True:
            for i, worker in enumerate(self.workers):
                got, _ = self._call(worker.collect(0))
                for result in got:
                    self._assigned[i].discard(result.key)
                results.extend(got)
            if results or time.monotonic() >= deadline or not self.in_flight:
                return results, {}
            time.sleep(0.002)

    def hurry(self, keys: Sequence[tuple[str, int]]) -> None:
        for worker in self.workers:
            self._loop.call_soon_threadsafe(worker.hurry, list(keys))

    def add_chain(self, name: str, specs: Sequence[StageSpec]) -> None:
        for worker in self.workers:
            worker.add_chain(name, specs)

    def stop(self, reason: str) -> None:
        for worker in self.workers:
            worker.stop(reason)

    def resume(self) -> None:
        for worker in self.workers:
            worker.resume()

    def close(self) -> None:
        for worker in self.workers:
            self._call(worker.aclose())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()
