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

What a worker was given but has not answered is remembered here per actor
(``factory.engine.roster``): if the actor dies or cannot be reached (OOM, its
node lost, ``ray kill``), its items go to the other workers at once and a new
actor takes its place wherever the cluster has room (answers already stored in
the response cache cost nothing the second time), so nothing is lost and a call
is paid again only if it was in flight on the lost worker. Every call to a
worker, control calls included, takes a lost worker the same way.

``LocalPool`` runs the same workers in this process (one event loop thread):
the loop's tests and small runs use it without Ray.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NoReturn, Protocol

from factory.engine import watchdog
from factory.engine.roster import Roster, State
from factory.engine.stages.base import StageSpec
from factory.engine.work import Item, ItemResult
from factory.engine.worker import Worker, freeze_heap
from factory.errors import WorkersLost

__all__ = ["ActorPool", "LocalPool", "Pool", "WorkerActor"]

log = logging.getLogger(__name__)

COLLECT_WAIT_S = 1.0  # a collect call returns after this long even with nothing done
CONTROL_TIMEOUT_S = 60.0  # a control call (stop, add_chain) unanswered this long: worker lost
START_TIMEOUT_S = 600.0  # no worker running this long (the cluster has no room): the run ends
WAITING_SAID_AFTER_S = 20.0  # workers still waiting for room this long are said on the console


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
        stopped: the run's stop reason when this actor is made (a replacement made
            after the driver stopped issuing), or None.
    """

    def __init__(
        self,
        chains: Mapping[str, Sequence[StageSpec]],
        lifeline: tuple[str, int] | None,
        stopped: str | None = None,
    ) -> None:
        watchdog.start(lifeline=lifeline)  # no request leaves once the driver is gone
        self.worker = Worker(chains, health=self._health)
        if stopped is not None:
            self.worker.stop(stopped)
        self._node: str | None = _node_id()
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
        """Start ``items`` (if any), then wait for results (``Worker.collect``). The first
        reply names this actor's node (``NODE_KEY``). Once the watchdog stopped this
        worker (its node or its driver is going) it never answers again: an item cut
        short must not reach the driver as a failed row, and the driver gives the
        items this worker held to the others when the actor is gone."""
        if items and not watchdog.stopped():
            await self.worker.submit(items)
        results, report = await self.worker.collect(max_wait)
        if watchdog.stopped():
            await asyncio.Event().wait()  # the process ends within the watchdog's grace
        if self._node is not None:
            report = {**report, NODE_KEY: self._node}
            self._node = None
        return results, report

    async def hurry(self, keys: list[tuple[str, int]]) -> None:
        self.worker.hurry(keys)

    async def add_chain(self, name: str, specs: list[StageSpec]) -> None:
        self.worker.add_chain(name, specs)

    async def stop(self, reason: str) -> None:
        self.worker.stop(reason)

    async def resume(self) -> None:
        self.worker.resume()

    async def shutdown(self) -> None:
        watchdog.retire()  # a normal end: the lifeline closing next is no loss
        await self.worker.aclose()


NODE_KEY = "_node"  # in a worker's first report: the Ray node it runs on


def _node_id() -> str | None:
    try:
        import ray

        return str(ray.get_runtime_context().get_node_id())
    except Exception:  # outside Ray (tests build the actor class directly)
        return None


@dataclass
class _Slot:
    """The driver's view of one worker place's current actor."""

    handle: Any
    generation: int = 0
    collecting: Any = None  # the outstanding collect call's ObjectRef
    riding: list[Item] = field(default_factory=list)  # go out with the next collect call
    chains: dict[str, int] = field(default_factory=dict)  # chain versions it knows
    stopped: str | None = None  # the stop reason it knows
    since: float = field(default_factory=time.monotonic)  # made at


Notify = Callable[[str], None]


class ActorPool:
    """``actors`` Ray actors running the given chains; at most ``capacity`` items each.

    Placement: actors are spread over the cluster's nodes (Ray's ``SPREAD``), so one
    lost node takes as few workers as it can; ``placement="pack"`` leaves it to Ray.

    Nodes come and go (issue 33): a worker lost with its node (or killed, or out of
    memory) is replaced by a new actor, which starts wherever the cluster has room,
    now or when a node joins; its items go to the other workers meanwhile
    (``factory.engine.roster``), and answers it had already stored come from the
    response cache. Each change in the number of running workers is said through
    ``notify`` (the run's console).

    Args:
        chains: chains every actor knows from the start.
        actors: how many.
        num_cpus: each actor's CPU reservation (fractional on a small machine).
        capacity: items one actor holds at once (its LLM slots and a queue as deep).
        lifeline: the driver's lifeline address, passed to each actor.
        max_restarts: new actors made for lost ones, per worker place, over the run
            (a worker that dies at every start, a bug, ends the run after that many).
        placement: ``spread`` (default) or ``pack``.
        notify: where the pool says what happened to its workers (default: the log).
        slots_per_worker: LLM requests one worker holds at once, for those messages.
        start_timeout_s: how long the run waits with no worker running before it stops
            (the cluster has no room for even one actor).
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
        placement: str = "spread",
        notify: Notify | None = None,
        slots_per_worker: int | None = None,
        start_timeout_s: float = START_TIMEOUT_S,
    ) -> None:
        import ray

        self._ray = ray
        options: dict[str, Any] = {
            "num_cpus": num_cpus,
            "max_restarts": 0,  # this pool makes new actors itself (roster): it must know
            "max_task_retries": 0,
            "max_concurrency": max(1000, 4 * capacity),
        }
        if placement == "spread":
            options["scheduling_strategy"] = "SPREAD"
        self._remote = ray.remote(WorkerActor).options(**options)
        self._lifeline = lifeline
        self.capacity = capacity
        self.num_cpus = num_cpus
        self._chains: dict[str, list[StageSpec]] = {k: list(v) for k, v in chains.items()}
        self._versions: dict[str, int] = dict.fromkeys(self._chains, 0)
        self._stop: str | None = None
        self.roster = Roster(actors, capacity, replacements=max_restarts * actors)
        self.slots = [self._make(0) for _ in range(actors)]
        self._submits: list[Any] = []
        self._notify = notify or _console_line
        self._per_worker = slots_per_worker
        self._start_timeout_s = start_timeout_s
        self._none_ready_since: float | None = time.monotonic()
        self._waiting_said = False
        self.restarts = 0

    def wait_started(self, timeout: float) -> int:
        """Wait until every worker runs (or ``timeout`` s pass); returns how many do.
        The driver loop needs no such wait (it issues as workers start); tests do."""
        deadline = time.monotonic() + timeout
        while self.roster.counts()[0] < len(self.slots) and time.monotonic() < deadline:
            results, _ = self.poll(0.1)
            assert not results, "a worker answered items before it was given any"
        return self.roster.counts()[0]

    def _make(self, generation: int) -> _Slot:
        handle = self._remote.remote(dict(self._chains), self._lifeline, self._stop)
        return _Slot(handle, generation, chains=dict(self._versions), stopped=self._stop)

    # -- work -----------------------------------------------------------------------------
    @property
    def in_flight(self) -> int:
        return self.roster.in_flight

    def room(self) -> int:
        return self.roster.room()

    def submit(self, items: Sequence[Item]) -> None:
        """Hand items to the least loaded ready actors (each up to its capacity); what
        does not fit waits for a place (``Roster.place``)."""
        for number, chunk in self.roster.place(items).items():
            slot = self.slots[number]
            if slot.collecting is None:  # its next collect call goes out with them
                slot.riding.extend(chunk)
            else:
                self._submits.append(slot.handle.submit.remote(chunk))

    def poll(self, timeout: float) -> tuple[list[ItemResult], dict[int, dict[str, Any]]]:
        """Results that came back within ``timeout`` s (all that are ready), and each
        replying actor's health report (by actor number)."""
        ray = self._ray
        self._reap_submits()
        if self.roster.backlog:
            self.submit([])  # items of a lost worker, to the workers with room
        for number, slot in enumerate(self.slots):
            state = self.roster.members[number].state
            if state is not State.LOST and slot.collecting is None:
                riding, slot.riding = slot.riding, []
                # A starting actor answers at once: it takes items only once it has.
                wait = 0.0 if state is State.STARTING else COLLECT_WAIT_S
                slot.collecting = slot.handle.collect.remote(wait, riding or None)
        waiting = {s.collecting: n for n, s in enumerate(self.slots) if s.collecting is not None}
        if not waiting:
            self._check_alive()
            return [], {}
        ready, _ = ray.wait(list(waiting), num_returns=1, timeout=timeout)
        if ready:
            more, _ = ray.wait(list(waiting), num_returns=len(waiting), timeout=0)
            ready = list(dict.fromkeys([*ready, *more]))
        results: list[ItemResult] = []
        health: dict[int, dict[str, Any]] = {}
        for ref in ready:
            number = waiting[ref]
            slot = self.slots[number]
            slot.collecting = None
            try:
                got, report = ray.get(ref)
            except _lost_errors(ray) as exc:
                self._lost(number, exc)
                continue
            except ray.exceptions.RayTaskError as exc:
                _stage_error(exc)
            node = report.pop(NODE_KEY, None) if report else None
            if self.roster.members[number].state is State.STARTING:
                self._started(number, node)
                if self.slots[number] is not slot:
                    continue
            results.extend(self.roster.answered(number, got))
            if report:
                health[number] = report
        self._check_alive()
        return results, health

    def hurry(self, keys: Sequence[tuple[str, int]]) -> None:
        """Tell the actors holding these items that the driver waits on them."""
        for number, mine in self.roster.holder(keys).items():
            self._submits.append(self.slots[number].handle.hurry.remote(mine))

    def _reap_submits(self) -> None:
        if not self._submits:
            return
        done, self._submits = self._ray.wait(
            self._submits, num_returns=len(self._submits), timeout=0
        )
        for ref in done:
            try:
                self._ray.get(ref)
            except _lost_errors(self._ray):
                continue  # a dead actor shows on its collect call, which re-issues its items
            except self._ray.exceptions.RayTaskError as exc:
                _stage_error(exc)

    # -- workers come and go --------------------------------------------------------------
    def _started(self, number: int, node: str | None) -> None:
        """A worker answered for the first time: it is ready; it learns what changed while
        it started (chains added, the stop); a replacement or a late joiner is said."""
        slot = self.slots[number]
        member = self.roster.members[number]
        member.node = node
        late = time.monotonic() - slot.since
        self._sync(number)
        if self.slots[number] is not slot or member.state is State.LOST:
            return  # lost while it learnt what changed
        member.state = State.READY
        self._none_ready_since = None
        ready, size = self.roster.counts()
        if slot.generation > 0 or self._waiting_said:
            self._notify(
                f"worker {number} started on node {_short(node)}"
                f"{' after ' + format(late, '.0f') + ' s' if late >= 10 else ''}: "
                f"{self._strength(ready, size)}"
            )
            self._waiting_said = ready < size and self._waiting_said

    def _sync(self, number: int) -> None:
        """Bring a worker that just started up to date (chains added or replaced since it
        was made, the stop) before it is given items."""
        slot = self.slots[number]
        calls = [
            slot.handle.add_chain.remote(name, self._chains[name])
            for name, version in self._versions.items()
            if slot.chains.get(name) != version
        ]
        if slot.stopped != self._stop:
            if self._stop is None:
                calls.append(slot.handle.resume.remote())
            else:
                calls.append(slot.handle.stop.remote(self._stop))
        if calls:
            self._get(number, calls)
        slot.chains, slot.stopped = dict(self._versions), self._stop

    def _lost(self, number: int, exc: BaseException) -> None:
        """An actor died or cannot be reached: its items go to the others (first in line),
        a new actor takes its place if the run still may make one, and the console
        says how many workers the run goes on with."""
        ray = self._ray
        slot = self.slots[number]
        node = self.roster.members[number].node
        with contextlib.suppress(Exception):  # unreachable but alive: no more calls from it
            ray.kill(slot.handle, no_restart=True)
        items, replace = self.roster.lose(number)
        self.restarts += 1
        log.info(
            "worker %d lost (%s: %s); %d of its items are issued again",
            number,
            type(exc).__name__,
            short_error(exc),
            len(items),
        )
        if replace:
            self.slots[number] = self._make(slot.generation + 1)
        else:
            slot.collecting, slot.riding = None, []
        ready, size = self.roster.counts()
        if _node_gone(ray, node):
            where = f"its node {_short(node)} is gone"
        elif isinstance(exc, ray.exceptions.ActorUnavailableError):
            where = f"it cannot be reached: its node {_short(node)} may be gone"
        else:
            where = f"it died on node {_short(node)}"
        then = (
            "a new worker starts as soon as the cluster has room"
            if replace
            else "no new worker is made (ray.max_restarts reached)"
        )
        self._notify(
            f"worker {number} lost ({where}): {len(items)} of its items go to the other "
            f"workers, answers it stored cost nothing again; {then}; "
            f"{self._strength(ready, size)}"
        )
        if not ready:
            self._none_ready_since = self._none_ready_since or time.monotonic()

    def _strength(self, ready: int, size: int) -> str:
        text = f"{ready} of {size} workers running"
        if self._per_worker:
            text += f" (concurrency {ready * self._per_worker} of {size * self._per_worker})"
        return text

    def _check_alive(self) -> None:
        """End the run when no worker can ever run again, or none could start for
        ``start_timeout_s``; say once when some workers wait for room."""
        if not self.roster.alive():
            raise WorkersLost(
                "every worker of the run died (and ray.max_restarts new ones after them); "
                f"{self.roster.lost} actors were lost: see logs/run.log"
            )
        ready, size = self.roster.counts()
        now = time.monotonic()
        if ready == 0:
            since = self._none_ready_since = self._none_ready_since or now
            if now - since > self._start_timeout_s:
                raise WorkersLost(
                    f"no worker of the run could start for {self._start_timeout_s:.0f} s: the "
                    f"Ray cluster has no room for an actor of {self.num_cpus} CPUs "
                    "(ray.num_cpus); the output folder is resumable"
                )
            return
        starting = [
            s.since
            for n, s in enumerate(self.slots)
            if self.roster.members[n].state is State.STARTING
        ]
        if starting and not self._waiting_said and now - min(starting) > WAITING_SAID_AFTER_S:
            self._waiting_said = True
            why = (
                f"not running yet (starting, or waiting for room in the Ray cluster: "
                f"{self.num_cpus} CPUs each); they join as soon as they can"
            )
            self._notify(f"{self._strength(ready, size)}; {len(starting)} {why}")

    # -- control --------------------------------------------------------------------------
    def _broadcast(self, make: Callable[[Any], Any]) -> None:
        """One control call to every ready worker, each awaited; a worker lost meanwhile
        is handled as on a collect call (a starting one learns it in ``_sync``)."""
        for number in [m.number for m in self.roster.ready()]:
            self._get(number, [make(self.slots[number].handle)])

    def _get(self, number: int, refs: list[Any]) -> None:
        ray = self._ray
        generation = self.slots[number].generation
        for ref in refs:
            try:
                ray.get(ref, timeout=CONTROL_TIMEOUT_S)
            except (*_lost_errors(ray), ray.exceptions.GetTimeoutError) as exc:
                if self.slots[number].generation == generation:
                    self._lost(number, exc)
                return
            except ray.exceptions.RayTaskError as exc:
                _stage_error(exc)

    def add_chain(self, name: str, specs: Sequence[StageSpec]) -> None:
        self._chains[name] = list(specs)
        self._versions[name] = self._versions.get(name, -1) + 1
        version = self._versions[name]
        self._broadcast(lambda h: h.add_chain.remote(name, list(specs)))
        for number in [m.number for m in self.roster.ready()]:
            self.slots[number].chains[name] = version

    def stop(self, reason: str) -> None:
        self._stop = reason
        self._broadcast(lambda h: h.stop.remote(reason))
        for number in [m.number for m in self.roster.ready()]:
            self.slots[number].stopped = reason

    def resume(self) -> None:
        self._stop = None
        self._broadcast(lambda h: h.resume.remote())
        for number in [m.number for m in self.roster.ready()]:
            self.slots[number].stopped = None

    def close(self) -> None:
        """Close the workers' sessions and caches, then end the actors."""
        ray = self._ray
        # Ready workers only: one still waiting for room in the cluster would hold this up.
        refs = [self.slots[m.number].handle.shutdown.remote() for m in self.roster.ready()]
        with contextlib.suppress(Exception):
            ray.wait(refs, num_returns=len(refs), timeout=10)
        for slot in self.slots:
            with contextlib.suppress(Exception):
                ray.kill(slot.handle)


def _lost_errors(ray: Any) -> tuple[type[BaseException], ...]:
    """What a call to a worker raises when its actor is gone or cannot be reached: dead
    (``RayActorError``), unreachable for now (``ActorUnavailableError``: it may or may
    not have run the call), or its reply lost with its node (``ObjectLostError``)."""
    exceptions = ray.exceptions
    return (exceptions.RayActorError, exceptions.ActorUnavailableError, exceptions.ObjectLostError)


def _node_gone(ray: Any, node: str | None) -> bool:
    """Whether the GCS has ``node`` as dead (a lost worker's node, to say so)."""
    if node is None:
        return False
    try:
        return any(n["NodeID"] == node and not n["Alive"] for n in ray.nodes())
    except Exception:
        return False


def _console_line(line: str) -> None:
    """A change in the run's workers, on the console and in the run log."""
    from factory.engine.console import console

    log.info(line)
    print(f"workers: {line}", file=console(), flush=True)


def _short(node: str | None) -> str:
    return node[:8] if node else "(unknown)"


def short_error(exc: BaseException) -> str:
    """The first line of a Ray error (its messages carry whole tracebacks)."""
    text = str(exc).strip().splitlines()
    return text[0][:200] if text else type(exc).__name__


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
