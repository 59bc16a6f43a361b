"""The one driver loop every job runs: issue what the planner asks, use results in order.

A job (``Job``, the contract every job of ``factory.engine.jobs`` implements) is a
declaration: the chains of stages its workers run, a ``Planner`` that says what to
issue next from what came back, a ``Sink`` that files each final row (data,
surplus, rejects, failed), the caps and worker shape it runs under; when the loop
is done, ``Job.finish`` closes its writers and returns a ``JobReport`` the runner
writes into the manifest. ``drive`` runs the declaration:

1. while the workers have room, the ledger admits LLM items (budget caps) and the
   planner issues items (``Planner.issue``);
2. results come back as items finish (``Pool.poll``): each is counted at once
   (``Ledger.arrived``: spend, calls, progress), a paid response the cache refused
   is kept before anything else (``Sink.arrived``);
3. results are *used* in item order (``Reorder``): the planner observes them (what
   to issue next depends on the observed yield) and the sink files their rows, each
   fate counted by the ledger (``Ledger.decided``);
4. an item that has held back results already in (``Reorder.blocking``) for
   ``HURRY_AFTER_S`` is hurried: its retries stop waiting out the backoff's jitter
   (``Pool.hurry``);
5. a cap reached, a refused cache write or the planner's own end stops issuing:
   the workers refuse what they have not sent yet (``Pool.stop``), and the loop ends
   when everything issued came back.

There are no rounds: an item goes out the moment a slot frees, whatever the
others are doing, and the planner stops issuing as soon as what is in flight is
expected to be enough. No job writes a loop, an account or a manifest section of
its own (``factory.engine.jobs``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Protocol

from factory.engine.ledger import Caps, Ledger
from factory.engine.pool import Pool
from factory.engine.rows import Fate, Row
from factory.engine.stages.base import StageSpec
from factory.engine.work import Item, ItemResult, Reorder
from factory.engine.worker import NOT_NEEDED

__all__ = [
    "Bar",
    "Declaration",
    "Declared",
    "Health",
    "Job",
    "JobReport",
    "Planner",
    "Sink",
    "Workers",
    "drive",
    "wind_down",
]

log = logging.getLogger(__name__)

POLL_S = 0.25  # the longest the loop waits for a result before it looks around again
HURRY_AFTER_S = 0.5  # an item that held back later results this long is hurried


@dataclass(frozen=True)
class Bar:
    """One progress line: ``n`` of ``total`` (None: unknown) and what follows."""

    name: str
    n: int
    total: int | None = None
    postfix: dict[str, Any] = field(default_factory=dict)
    done: bool = False


class Planner(Protocol):
    """What to issue next, from what came back (in order)."""

    def issue(self, room: int, llm_room: int) -> list[Item]:
        """Up to ``room`` items, at most ``llm_room`` of them making LLM calls, each the
        next index of its stream; [] when nothing should go out now."""
        ...

    def wanted(self, result: ItemResult) -> bool:
        """Whether a result (in index order) still counts: False drops it unfiled (work
        issued ahead that the job no longer needs, e.g. episodes past the one that met
        the quotas; a paid answer past the target is wanted: it goes to surplus)."""
        ...

    def observe(self, result: ItemResult) -> None:
        """A result, in index order, after the sink filed its rows."""
        ...

    @property
    def finished(self) -> bool:
        """Nothing more will be issued: the job has what it needs (or cannot get it).
        A planner may be finished for a while and then not (``MixPlanner``: a part is
        done, the next starts once the part's items came back): the loop stops the
        workers' unsent items meanwhile and resumes them."""
        ...

    @property
    def stopped_by(self) -> str | None:
        """Why the job ended short of its goal (e.g. ``no_progress``), if it did."""
        ...

    def bars(self) -> list[Bar]:
        """The progress lines to show now."""
        ...


class Sink(Protocol):
    """Where final rows go."""

    def arrived(self, result: ItemResult) -> None:
        """A result came back (any order): keep what must not wait (unstored answers)."""
        ...

    def add(self, row: Row, stream: str) -> Fate | None:
        """File one row of ``stream`` (in order; it may mark it: a duplicate becomes a
        reject of stage ``dedup``; ``factory.engine.filing``); returns its fate: accepted,
        surplus, rejected, failed, or unissued (never sent) or None (not a row of the
        totals: both counted apart)."""
        ...

    @property
    def stop_reason(self) -> str | None:
        """A reason to stop issuing at once (the cache refused a write), or None."""
        ...


class Progress(Protocol):
    def show(self, bars: Sequence[Bar]) -> None: ...


class Health(Protocol):
    """Reads the workers' endpoint reports; says when to warn and when to give up."""

    def report(self, reports: dict[int, dict[str, Any]], ledger: Ledger) -> str | None:
        """Warnings go to the console; returns a stop reason when the run should end."""
        ...


class Declared(Protocol):
    """What ``drive`` reads of a job: its planner, its sink, what an LLM item reserves."""

    @property
    def planner(self) -> Planner: ...

    @property
    def sink(self) -> Sink: ...

    @property
    def reserve(self) -> tuple[float, int]:
        """(cost, tokens) one LLM item reserves against the caps (a batched backend's
        estimate; zeros for online backends, whose spend is counted as it comes)."""
        ...


@dataclass
class Declaration:
    """A job as a declaration: its chains, planner and sink (``factory.engine.jobs``)."""

    name: str
    chains: Mapping[str, Sequence[StageSpec]]
    planner: Planner
    sink: Sink
    #: (cost, tokens) one LLM item reserves against the caps (a batched backend's
    #: estimate; zeros for online backends, whose spend is counted as it comes).
    reserve: tuple[float, int] = (0.0, 0)


@dataclass(frozen=True)
class Workers:
    """The shape of a job's workers: items one worker holds at once (``capacity``) and
    its LLM request slots (``slots``; None: the pool's default, a CPU job)."""

    capacity: int = 8
    slots: int | None = None


@dataclass(frozen=True)
class JobReport:
    """What a job tells the manifest once the loop is done (``Job.finish``).

    ``sections``: the job's own manifest sections (a None value is left out, except
    ``mixture``: its absence is said). ``totals`` / ``stages``: a job whose rows are
    decided after the loop (the envsim selection) gives its own; None takes the
    ledger's. ``report``: a text the run's summary prints (the selection's report).
    """

    sections: Mapping[str, object] = field(default_factory=dict)
    totals: Mapping[str, int] | None = None
    stages: Mapping[str, Mapping[str, int]] | None = None
    report: str | None = None


class Job(Declared, Protocol):
    """The contract every job implements (``factory.engine.jobs``; the runner sees no
    other): the declaration ``drive`` runs, what the runner sets up around it, and what
    it reports at the end."""

    @property
    def name(self) -> str:
        """The job's kind (``curate``, ``amplify``, ``envsim``)."""
        ...

    @property
    def pipeline(self) -> str:
        """What the manifest's ``pipeline`` says."""
        ...

    @property
    def chains(self) -> Mapping[str, Sequence[StageSpec]]:
        """The chains of stages its workers run from the start (more may be added while
        it runs through the ``add_chain`` it was declared with)."""
        ...

    @property
    def caps(self) -> Caps:
        """The budget caps the run's ledger enforces."""
        ...

    @property
    def workers(self) -> Workers:
        """Items per worker and LLM slots per worker."""
        ...

    def running(self, progress: bool) -> AbstractContextManager[None]:
        """Held while the loop runs: the job's own console lines (a batched backend's
        batches), shown when ``progress``."""
        ...

    def finish(self, ledger: Ledger, stopped_by: str | None) -> JobReport:
        """Close the writers; what the manifest says of the job (the ledger adds its own)."""
        ...

    def error(self, stopped_by: str | None) -> str | None:
        """A failure the run ends with although the loop ended (paid answers the cache
        refused, and where they are kept), or None."""
        ...


def drive(
    job: Declared,
    pool: Pool,
    ledger: Ledger,
    *,
    progress: Progress | None = None,
    health: Health | None = None,
    poll_s: float = POLL_S,
) -> str | None:
    """Run ``job`` on ``pool`` to its end; returns why it stopped short (a cap name,
    ``cache_write``, the planner's or the health check's reason), or None."""
    reorder = Reorder()
    llm_keys: set[tuple[str, int]] = set()
    blocked_since: dict[tuple[str, int], float | None] = {}  # None: hurried already
    stop: str | None = None
    planner, sink = job.planner, job.sink
    while True:
        if stop is None:
            stop = _stop_reason(ledger, sink, planner.finished)
            if stop is not None:
                pool.stop(stop)
        if stop is None and not planner.finished:
            room = pool.room()
            if room > 0:
                llm_room = ledger.allowance(room, len(llm_keys), job.reserve)
                items = planner.issue(room, llm_room)
                _check_admitted(items, llm_room)
                for item in items:
                    reorder.issue(item)
                    if item.llm:
                        llm_keys.add(item.key)
                ledger.reserve(sum(1 for i in items if i.llm), job.reserve)
                if items:
                    pool.submit(items)
                elif llm_room == 0 and ledger.stopped_by and not llm_keys:
                    stop = ledger.stopped_by  # a cap leaves no room and nothing is out
        if stop is None and planner.finished and reorder.pending():
            pool.stop(NOT_NEEDED)  # started requests finish; the rest never go out
            stop = NOT_NEEDED
        if not reorder.pending() and (stop is not None or planner.finished):
            if stop == NOT_NEEDED and not planner.finished:
                # the planner has more once what it issued came back (a mixed recipe's
                # next part): the workers take items again
                pool.resume()
                stop = None
                continue
            break
        results, reports = pool.poll(poll_s)
        for result in results:
            reserved = job.reserve if result.key in llm_keys else (0.0, 0)
            llm_keys.discard(result.key)
            ledger.arrived(result, reserved=reserved)
            sink.arrived(result)
            reorder.add(result)
        for result in reorder.release():
            if not planner.wanted(result):
                continue
            for row in result.rows:
                kind = sink.add(row, result.stream)
                if kind is not None and kind != Fate.UNISSUED:
                    ledger.decided(row, kind)
            planner.observe(result)
        blocked_since = _hurry(pool, reorder.blocking(), blocked_since, time.monotonic())
        if health is not None and stop is None:
            why = health.report(reports, ledger)
            if why is not None:
                stop = why
                pool.stop(why)
        if progress is not None:
            progress.show(with_spend(planner.bars(), ledger))
    if progress is not None:
        progress.show([_done(b) for b in with_spend(planner.bars(), ledger)])
    if stop == NOT_NEEDED:
        pool.resume()
        stop = None
    return stop or planner.stopped_by


def wind_down(
    pool: Pool,
    sink: Sink,
    reason: str,
    grace_s: float,
    *,
    poll_s: float = POLL_S,
    clock: Any = time.monotonic,
) -> list[ItemResult]:
    """After ``drive`` ended at once (an interrupt, a failed write): stop issuing and give
    the requests already sent ``grace_s`` to finish; returns the results that came back.

    Why: closing the pool cancels whatever is on the wire, and a provider bills the tokens
    it generated before a cancel while the resume sends those requests again. A worker
    stores each answer in the response cache before it returns it, so waiting is all it
    takes to keep them; an answer the cache refused rides on its row and is kept here
    (``Sink.arrived``: ``OUT/unstored/``), the rows themselves are not filed (the run is
    not finishing). Items not sent yet come back at once, refused (``Pool.stop``). Best
    effort: a pool that cannot answer (its Ray torn down by the same Ctrl-C) ends it.
    """
    came: list[ItemResult] = []
    try:
        pool.stop(reason)
        deadline = clock() + grace_s
        while pool.in_flight and (left := deadline - clock()) > 0:
            results, _ = pool.poll(min(left, poll_s))
            for result in results:
                sink.arrived(result)
            came.extend(results)
    except Exception as exc:  # the interrupt or the failure in hand is what the run reports
        log.info("winding down the workers failed: %s: %s", type(exc).__name__, exc)
    return came


def _hurry(
    pool: Pool,
    blocking: list[tuple[str, int]],
    since: dict[tuple[str, int], float | None],
    now: float,
) -> dict[tuple[str, int], float | None]:
    """Hurry each item that has held back later results for ``HURRY_AFTER_S``; returns
    when each blocking item began to block (None: hurried already).

    Why wait at all: in a healthy run the oldest item is almost always holding back a few
    results for a moment (rows are used in call order), and a Ray call per release cost
    the driver 6% of its time (py-spy, the peer benchmark) for nothing to hurry.
    """
    out = {key: since.get(key, now) for key in blocking}
    due = [key for key, t in out.items() if t is not None and now - t >= HURRY_AFTER_S]
    if due:
        pool.hurry(due)
        out.update(dict.fromkeys(due))
    return out


def _stop_reason(ledger: Ledger, sink: Sink, finished: bool) -> str | None:
    """Why the loop must stop issuing: the sink's reason, else a cap, but only while the
    planner still wants work (a run whose last call reached the target and the call cap
    at once did what was asked)."""
    if sink.stop_reason is not None:
        return sink.stop_reason
    if finished:
        return None
    cap = ledger.exhausted()
    if cap is not None:
        ledger.stopped_by = ledger.stopped_by or cap
    return cap


def _check_admitted(items: list[Item], llm_room: int) -> None:
    n = sum(1 for i in items if i.llm)
    if n > llm_room:
        raise RuntimeError(f"planner issued {n} LLM items with room for {llm_room}")


def with_spend(bars: list[Bar], ledger: Ledger) -> list[Bar]:
    """The job's bars, the last (its main one) with the run's tokens and the dollars this
    run paid (answers replayed from the cache cost nothing): what the manifest will say."""
    if not bars or not ledger.calls:
        return bars
    last = bars[-1]
    spend = {"tok": ledger.run_tokens, "usd": f"{ledger.paid_usd:.2f}"}
    return [*bars[:-1], Bar(last.name, last.n, last.total, {**last.postfix, **spend}, last.done)]


def _done(bar: Bar) -> Bar:
    return Bar(bar.name, bar.n, bar.total, bar.postfix, done=True)
